#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a generative verifier, once, with the CLI only (docs/results.md).
#
# Candidates: the scored samples of `benchmarks/real_rl.py`'s TOPR run (builtin:arith level 1,
# chat template). Training: one round of TOPR on its own verdicts (2 per candidate, p̃ = 0.5).
# Then the trained verifier judges the RL run's final generator at test time (`topr eval --verifier-model`).
#
#   python benchmarks/real_rl.py --task arith:1 ... --work runs/real-rl   # first (see docs/results.md)
#   bash benchmarks/verifier_smollm2.sh [RL_WORK_DIR] [OUT_DIR]            # ~10 min on 2 CPU cores
set -euo pipefail
RR=$(realpath "${1:-runs/real-rl}")
W=$(realpath -m "${2:-runs/sm-verifier}")
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$W"
SM="$W/smollm2"
[ -d "$SM" ] || topr init-model "$SM" --preset smollm2-135m-instruct

# Verification data: training rounds' candidates (balanced, ≤ 2 per problem); held out: the eval's.
[ -e "$W/train.parquet" ] || topr verifier-data -s "$RR/topr/round-001/scored" "$RR/topr/round-002/scored" \
  -o "$W/train.parquet" --balance --max-per-question 2
[ -e "$W/test.parquet" ] || topr verifier-data -s "$RR/topr/round-002/eval/scored" -o "$W/test.parquet" --max-per-question 2

cat > "$W/verifier.yaml" <<YAML
run_dir: $W/run
model: $SM
rounds: 1
generate:
  dataset: {source: $W/train.parquet, split: train, chat_template: true}
  n: 2
  sampling: {temperature: 1.0, max_new_tokens: 8, seed: 0}
  engine: {backend: vllm, max_model_len: 2048}
  shard_size: 128
score: {verifier: judge}
curate: {positive_fraction: 0.5, unreachable_baseline: 0.0}
train: {loss: topr, optimizer: adamw, lr: 1.0e-5, batch_size: 32, micro_batch_tokens: 4096}
eval:
  dataset: {source: $W/test.parquet, split: test, chat_template: true, limit: 64}
  k: 2
  sampling: {temperature: 1.0, max_new_tokens: 8, seed: 1234}
  engine: {backend: vllm, max_model_len: 2048}
  candidates: $RR/topr/round-002/eval/scored
  verifier_chat_template: true
YAML
topr iterate -c "$W/verifier.yaml" --no-report
topr report "$W/run" --json > "$W/report.json"

# At test time: the RL run's eval settings, on its final policy, judged by the trained verifier.
python3 - "$RR" "$W" <<'PY'
import sys
import yaml
rr, w = sys.argv[1:]
ev = yaml.safe_load(open(f"{rr}/config.yaml"))["eval"]
ev.update(model=f"{rr}/topr/round-002/policy", out=f"{w}/eval-with-verifier", k=4,
          verifier_model=f"{w}/run/round-001/policy", verifier_chat_template=True)
ev["dataset"]["size"] = 32
yaml.safe_dump(ev, open(f"{w}/eval.yaml", "w"))
PY
topr eval -c "$W/eval.yaml"
