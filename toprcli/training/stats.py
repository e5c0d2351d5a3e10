"""Per-step statistics of the trainer, exact over micro-batches and ranks.

Pure bookkeeping over floats and tensors; reads and writes no files.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from toprcli.training.distributed import all_reduce, union_keys


def behavior_gap(stored: np.ndarray, own: np.ndarray) -> dict[str, float]:
    """Per-token gap between stored μ and the trainer's own log-probs of the starting policy."""
    if len(stored) == 0:
        return {"behavior_gap_mean": 0.0, "behavior_gap_max": 0.0, "behavior_gap_signed_mean": 0.0, "behavior_gap_tokens": 0}
    d = own.astype(np.float64) - stored.astype(np.float64)
    d = d[np.isfinite(d)]
    return {
        "behavior_gap_mean": float(np.abs(d).mean()) if len(d) else float("nan"),
        "behavior_gap_max": float(np.abs(d).max()) if len(d) else float("nan"),
        "behavior_gap_signed_mean": float(d.mean()) if len(d) else float("nan"),
        "behavior_gap_tokens": int(len(stored)),
    }


class StepStats:
    """Sums of one step's micro-batch metrics on this rank, reduced over ranks at the end.

    ``loss``-like metrics (already normalised per micro-batch by ``aggregate``)
    are weighted by the micro-batch's share of the step's normaliser, which
    makes them exact; TOPR α statistics are weighted by the negatives they
    average over, token-level fractions by the tokens they count over; other
    loss metrics by the active sequences.
    """

    EXACT = ("loss", "pg_loss", "kl", "kl_loss", "entropy")
    # A mean over tokens or sequences, and the metric counting what it averages over (a loss's clip fractions
    # report their units: sequences at ratio_level sequence); without it, the micro-batch's completion tokens.
    PER_TOKEN = {"clip_frac": "clip_frac_units", "dual_clip_frac": "dual_clip_frac_units", "neg_token_alpha_mean": "neg_tokens"}

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.maxes = {"log_ratio_max": -math.inf, "log_ratio_min_neg": -math.inf, "behavior_gap_max": -math.inf}

    def _add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def add(self, metrics: dict[str, float], share: float, n_active: int, tokens: int, completion_tokens: int) -> None:
        n_neg = metrics["n_neg"]
        for k, v in metrics.items():
            if k in self.EXACT:
                self._add(k, v * share)
            elif k in ("n_pos", "n_neg"):
                self._add(k, v)
            elif k in ("neg_alpha_mean", "neg_alpha_lt1_frac"):
                self._add(k, v * n_neg)
            elif k in self.PER_TOKEN:
                over = metrics.get(self.PER_TOKEN[k], completion_tokens)
                self._add(k, v * over)
                self._add(f"{k}/over", over)
            elif k == "neg_tokens":
                self._add(k, v)
            elif k.endswith("_units"):  # counted with its fraction above
                continue
            elif k == "log_ratio_max":
                if n_active:
                    self.maxes["log_ratio_max"] = max(self.maxes["log_ratio_max"], v)
            elif k == "log_ratio_min":
                if n_active:
                    self.maxes["log_ratio_min_neg"] = max(self.maxes["log_ratio_min_neg"], -v)
            else:
                self._add(k, v * n_active)
        self._add("n_active", n_active)
        self._add("tokens", tokens)
        self._add("completion_tokens", completion_tokens)

    def add_gap(self, abs_sum: float, signed_sum: float, count: int, max_abs: float) -> None:
        self._add("gap_abs", abs_sum)
        self._add("gap_signed", signed_sum)
        self._add("gap_count", count)
        if count:
            self.maxes["behavior_gap_max"] = max(self.maxes["behavior_gap_max"], max_abs)

    def reduce(self, ctx) -> dict[str, float]:
        keys = union_keys(self.sums, ctx)  # a key another rank lacks counts 0 there
        sums = all_reduce(torch.tensor([self.sums.get(k, 0.0) for k in keys], dtype=torch.float64), ctx).tolist()
        s = dict(zip(keys, sums))
        mkeys = sorted(self.maxes)
        maxes = dict(zip(mkeys, all_reduce(torch.tensor([self.maxes[k] for k in mkeys], dtype=torch.float64), ctx, op="max").tolist()))
        n_neg, n_active = s.pop("n_neg", 0.0), s.pop("n_active", 0.0)
        out: dict[str, float] = {}
        for k, v in s.items():
            if k in self.EXACT or k in ("n_pos", "tokens", "completion_tokens"):
                out[k] = v
            elif k in ("neg_alpha_mean", "neg_alpha_lt1_frac"):
                out[k] = v / n_neg if n_neg else 0.0
            elif k in self.PER_TOKEN:
                out[k] = v / s[f"{k}/over"] if s.get(f"{k}/over") else 0.0
            elif k == "neg_tokens":
                out[k] = int(round(v))
            elif k.startswith("gap_") or k.endswith("/over"):
                continue
            else:
                out[k] = v / n_active if n_active else 0.0
        out["n_neg"] = n_neg
        for k in ("n_pos", "n_neg", "tokens", "completion_tokens"):
            out[k] = int(round(out.get(k, 0.0)))
        out["log_ratio_max"] = maxes["log_ratio_max"] if n_active else 0.0
        out["log_ratio_min"] = -maxes["log_ratio_min_neg"] if n_active else 0.0
        if s.get("gap_count"):
            out["behavior_gap_mean"] = s["gap_abs"] / s["gap_count"]
            out["behavior_gap_signed_mean"] = s["gap_signed"] / s["gap_count"]
            out["behavior_gap_max"] = maxes["behavior_gap_max"]
            out["behavior_gap_tokens"] = int(s["gap_count"])
        return out


def add_gap(stats: StepStats, logprobs, mb) -> None:
    """Accumulate |log π − stored log μ| over a first-step micro-batch (π is still the starting policy)."""
    if len(mb.rows) == 0:
        return
    d = (logprobs.float() - mb.behavior) * mb.mask
    absd = d.abs()
    stats.add_gap(float(absd.sum()), float(d.sum()), int(mb.mask.sum()), float(absd.max()))
