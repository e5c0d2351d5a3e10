"""The cost of top-p processing of π: the kept set from a full vocabulary sort vs from top-k candidates.

SmolLM2-135M-Instruct's real logits on GSM8K text (512 positions, 49,152 tokens),
at temperature 1 and 0.7, top-p 0.9: the time of ``sampling.kept_mask`` with the
candidate tiers (``TOP_P_CANDIDATES``) and with the full sort only, medians of
``--repeats``; and the share of positions whose 256 most likely tokens hold less
than top_p (those take the next tier or the full sort). The trainer computes the
kept set twice per completion position (the LM head's chunk is recomputed in
backward), so this is paid 2× per step.

Usage: python benchmarks/top_p.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import toprcli.sampling as sampling
    from toprcli.models.pretrained import ensure_preset

    model = ensure_preset("smollm2-135m-instruct")
    tok, lm = AutoTokenizer.from_pretrained(model), AutoModelForCausalLM.from_pretrained(model)
    rows = [json.loads(line) for line in (REPO / "toprcli/data/gsm8k/test.jsonl").read_text().splitlines()[:8]]
    ids = torch.tensor([tok(" ".join(r["question"] + " " + r["answer"] for r in rows))["input_ids"][: args.positions]])
    with torch.no_grad():
        logits = lm(ids).logits[0].float()
    tiers = sampling.TOP_P_CANDIDATES
    print("| temperature | positions | candidates short of top-p (top 256) | full sort (s) | candidates (s) | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for temperature in (1.0, 0.7):
        z = logits / temperature
        p = sampling.Processing(top_p=args.top_p)
        short = float((torch.softmax(z, -1).topk(256, -1).values.sum(-1) < args.top_p).float().mean())
        sampling.TOP_P_CANDIDATES = ()
        full = timed(lambda: sampling.kept_mask(z, p), args.repeats)
        sampling.TOP_P_CANDIDATES = tiers
        fast = timed(lambda: sampling.kept_mask(z, p), args.repeats)
        print(f"| {temperature} | {z.shape[0]} | {short:.3f} | {full:.3f} | {fast:.3f} | {full / fast:.1f}× |")


if __name__ == "__main__":
    main()
