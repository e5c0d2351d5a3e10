"""The sampling distribution: logits → the processed distribution that μ and π are defined under.

Pure tensor code (no config, no files, no CLI); raises ``ValueError``. The contract
it implements (μ and π under one processing): docs/architecture.md §5.

A sampler does not draw from softmax(logits). It draws from the *processed*
distribution, in vLLM's order (its v1 sampler; the hf backend applies this
module so both engines agree):

    z  = logits / T                                    temperature
    keep min-p:   softmax(z)_v ≥ min_p · max_u softmax(z)_u
    keep top-k:   z_v ≥ the k-th largest z             (ties at the threshold kept)
    keep top-p:   drop the least likely tokens while their cumulative
                  probability (ascending, renormalised over what is left) ≤ 1 − p;
                  the most likely token is always kept
    log μ(v) = z_v − logsumexp(z over the kept set)    renormalised

``temperature < 1e-5`` (greedy, as vLLM decides) has no distribution; by convention log-probs
are then taken at T = 1 without truncation (what vLLM reports for greedy
requests), and losses that need μ must refuse such data.

**The kept set once π has moved.** The trainer computes log π(y_t) with the
same processing applied to π's *own* logits, and the token that was sampled
is always in the kept set (``always_keep``): a truncation is a property of the
distribution at that prefix, so it is recomputed from π; but a token that π's
truncation would now drop keeps a finite log-probability, so the importance
ratio π/μ of a sampled sequence is never 0 by construction and its gradient
exists. At step 0 (π = μ) the sampled token is inside μ's kept set anyway, so
π/μ = 1 exactly up to float rounding. The mask itself carries no gradient.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch


GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: any lower temperature samples greedily


@dataclass(frozen=True)
class Processing:
    """Parameters of the processed distribution (see the module docstring)."""

    temperature: float = 1.0
    top_k: int = -1  # -1: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        """vLLM decodes a temperature below 1e-5 greedily (its log-probs then at T = 1, untruncated)."""
        return self.temperature < GREEDY_BELOW

    @property
    def truncates(self) -> bool:
        """Whether some tokens can be dropped (then the kept set must be computed)."""
        return not self.greedy and (self.top_k != -1 or self.top_p < 1 or self.min_p > 0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, m: Any) -> "Processing":
        """From any mapping with (some of) temperature, top_k, top_p, min_p; missing keys are off."""
        top_k = m.get("top_k")
        return cls(
            temperature=float(m.get("temperature", 1.0)),
            top_k=-1 if top_k in (None, 0, -1) else int(top_k),
            top_p=float(m.get("top_p", 1.0) if m.get("top_p") is not None else 1.0),
            min_p=float(m.get("min_p") or 0.0),
        )


def kept_mask(z: torch.Tensor, p: Processing, always_keep: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """(N, V) bool, True where a token survives min-p, top-k and top-p; None if nothing is dropped.

    ``z`` (N, V) are the temperature-scaled float32 logits; ``always_keep`` (N,) token ids are preferred
    among logits tied at the top-p cut (see :func:`_top_p_keep`).
    """
    if not p.truncates:
        return None
    keep = torch.ones_like(z, dtype=torch.bool)
    if p.min_p > 0:
        probs = torch.softmax(z, dim=-1)  # (N, V)
        keep &= probs >= probs.amax(dim=-1, keepdim=True) * p.min_p
        del probs
    if p.top_k != -1 and p.top_k < z.shape[-1]:
        masked = z.masked_fill(~keep, float("-inf"))
        kth = masked.topk(p.top_k, dim=-1).values[:, -1:]  # (N, 1)
        keep &= masked >= kth
        del masked
    if p.top_p < 1:
        keep &= _top_p_keep(z.masked_fill(~keep, float("-inf")), p.top_p, always_keep)
    return keep


TOP_P_CANDIDATES = (256, 4096)  # the top-p cut is looked for among this many most likely tokens, in turn


def _top_p_keep(masked: torch.Tensor, top_p: float, always_keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N, V) bool: the smallest set of most likely tokens whose mass reaches ``top_p`` (vLLM's rule:
    sorted ascending, a token is dropped while the cumulative mass up to it is ≤ 1 − top_p).

    A full sort of the vocabulary costs ~25× a top-k of a few hundred, and the kept set is nearly
    always among the most likely few hundred tokens: among the top k candidates a token survives
    iff the mass of the tokens above it is < top_p. Rows whose candidates hold less than ``top_p``
    of the mass try the next k, then the full sort. Each row gives a count and the logit of its last
    kept token; :func:`_most_likely` keeps exactly that many.
    """
    n_keep = torch.zeros(masked.shape[0], dtype=torch.long, device=masked.device)  # (N,)
    last = torch.zeros(masked.shape[0], dtype=masked.dtype, device=masked.device)  # (N,) the last kept logit
    rows = torch.arange(masked.shape[0], device=masked.device)
    lse = torch.logsumexp(masked, dim=-1, keepdim=True)  # (N, 1)
    for k in TOP_P_CANDIDATES:
        if k >= masked.shape[-1] or len(rows) == 0:
            break
        top = masked[rows].topk(k, dim=-1).values  # (n, k) descending
        probs = torch.exp(top - lse[rows])  # (n, k)
        above = probs.cumsum(dim=-1) - probs  # (n, k) mass of the more likely candidates
        count = (above < top_p).sum(dim=-1, keepdim=True).clamp(min=1)  # (n, 1) ≥ 1: the top token stays
        inside = probs.sum(dim=-1) >= top_p  # (n,) rows whose cut lies among the candidates
        n_keep[rows[inside]], last[rows[inside]] = count[inside, 0], top.gather(-1, count - 1)[inside, 0]
        rows = rows[~inside]
    if len(rows):
        sorted_z = masked[rows].sort(dim=-1, descending=False).values  # ascending, as vLLM
        drop_sorted = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1) <= 1 - top_p  # (n, V) a prefix
        drop_sorted[:, -1] = False  # the most likely token always survives
        dropped = drop_sorted.sum(dim=-1)  # (n,)
        n_keep[rows], last[rows] = masked.shape[-1] - dropped, sorted_z.gather(-1, dropped[:, None])[:, 0]
    return _most_likely(masked, n_keep, last, always_keep)


def _most_likely(z: torch.Tensor, n_keep: torch.Tensor, last: torch.Tensor, always_keep: Optional[torch.Tensor]) -> torch.Tensor:
    """(N, V) bool: each row's ``n_keep`` most likely tokens, ``last`` the logit of the least likely of them.

    Logits tied at ``last`` may straddle the cut (bf16 logits tie often); vLLM keeps as many of them as its
    sort's positions allow, and only that count sets the normaliser. So exactly ``n_keep`` are kept: the
    ``always_keep`` token first (the one sampled), then by index.
    """
    keep = z >= last[:, None]  # (N, V)
    straddle = torch.nonzero(keep.sum(dim=-1) > n_keep).flatten()  # rows with a tie cut in two: rare
    if len(straddle):
        zs, cut = z[straddle], last[straddle, None]
        tied = zs == cut  # (n, V)
        first = torch.zeros_like(tied)
        if always_keep is not None:
            first.scatter_(-1, always_keep[straddle].view(-1, 1), True)
            first &= tied
        room = n_keep[straddle, None] - (zs > cut).sum(dim=-1, keepdim=True) - first.sum(dim=-1, keepdim=True)  # (n, 1)
        others = tied & ~first
        keep[straddle] = (zs > cut) | first | (others & (others.cumsum(dim=-1) <= room))
    return keep


def processed_logits(
    logits: torch.Tensor, p: Processing, *, always_keep: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """(N, V) float32 logits of the processed distribution: z / T, −inf outside the kept set.

    ``always_keep`` (N,) token ids stay in the kept set whatever the truncation
    says (the sampled tokens, when the trainer scores them). Differentiable
    with respect to ``logits``; the mask is a constant.
    """
    z = logits.float()
    if not p.greedy and p.temperature != 1.0:
        z = z / p.temperature
    keep = kept_mask(z.detach(), p, always_keep)
    if keep is None:
        return z
    if always_keep is not None:
        keep.scatter_(-1, always_keep.view(-1, 1), True)
    return z.masked_fill(~keep, float("-inf"))


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, p: Processing, *, with_entropy: bool = False
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log-prob of ``targets`` (N,) under the processed distribution of ``logits`` (N, V).

    The targets are always kept (see the module docstring). Returns
    ``(logprobs (N,), entropy (N,) or None)``, float32, differentiable; the
    entropy is that of the processed distribution, −Σ_v q_v log q_v.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (N, V) and targets (N,), got {tuple(logits.shape)} and {tuple(targets.shape)}")
    z = processed_logits(logits, p, always_keep=targets)
    logq = torch.log_softmax(z, dim=-1)  # (N, V), −inf outside the kept set
    lp = logq.gather(-1, targets.view(-1, 1)).squeeze(-1)
    ent = None
    if with_entropy:
        q = logq.exp()
        ent = -(q * logq.masked_fill(q == 0, 0.0)).sum(-1)  # 0 · log 0 = 0
    return lp, ent
