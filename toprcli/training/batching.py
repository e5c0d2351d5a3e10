"""Token data, the seeded data order, token-budget micro-batches and padding.

Reads a curated training set (see ``toprcli.shards.CURATED_SCHEMA``) into flat
NumPy arrays (one flat array per list column plus row offsets), so a dataset
of millions of tokens costs a few arrays, not millions of Python ints.

Batching, from the optimizer step down:

* **Step batch**: whole units (a row; a prompt's rows with ``group_by_prompt``;
  a DPO pair) while they fit ``batch_size`` rows per optimizer step, taken in
  order from a stream of seeded per-epoch permutations of the units
  (:func:`step_plan`). Step ``k`` always gets the same units, so a resumed run
  needs only the step number.
* **Ranks**: a step's units are sorted by their longest row and dealt
  round-robin over the ranks (:func:`split_units`), which balances tokens.
* **Micro-batches**: each rank packs its units, longest first, into
  micro-batches whose padded size ``rows × longest`` fits ``micro_batch_tokens``
  (:func:`pack_units`); gradients accumulate over them. Every rank runs the same
  number of forward passes (FSDP all-gathers in each one), padding with empty
  micro-batches that contribute exactly zero.

Layout of one micro-batch (:func:`collate`): row i is ``prompt_i + completion_i``
right-padded; causal attention means real tokens never see the padding, so no
attention mask is needed. Per-token tensors (``behavior``, ``mask``, ...) are
completion-aligned: column j is completion token j.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from collections.abc import Callable
from typing import Optional

import numpy as np
import pyarrow as pa
import torch

# Columns the trainer reads (everything else in a curated file is ignored); the list columns are the heavy ones.
LIST_COLUMNS = ("prompt_token_ids", "completion_token_ids", "behavior_logprobs")
TOKEN_COLUMNS = (*LIST_COLUMNS, "advantage", "weight")


def _flat_list(column: pa.ChunkedArray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (flat values, offsets (n+1,)); nulls count as empty lists."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ChunkedArray):  # zero chunks
        arr = pa.array([], type=column.type)
    if arr.null_count:
        arr = pa.compute.fill_null(arr, pa.scalar([], type=arr.type))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values.to_numpy(zero_copy_only=False), dtype=dtype)
    # A sliced array's values start at offsets[0].
    values = values[offsets[0] : offsets[-1]]
    return values, offsets - offsets[0]


@dataclass
class TokenData:
    """A training set as flat arrays. ``*_off`` are row offsets (n+1,) into the flat arrays; the lengths, an O(rows) pass
    each that every step's plan reads, are computed once (the offsets never change)."""

    prompt_ids: np.ndarray  # (total prompt tokens,) int32, as stored (collate widens a micro-batch's: 4 B a token, not 8)
    prompt_off: np.ndarray  # (n+1,)
    completion_ids: np.ndarray  # (total completion tokens,) int32
    completion_off: np.ndarray  # (n+1,)
    behavior: np.ndarray  # (total completion tokens,) float32, log μ
    behavior_off: np.ndarray  # (n+1,) — must equal completion_off (checked by the trainer)
    advantages: np.ndarray  # (n,) float32
    weights: np.ndarray  # (n,) float32

    @classmethod
    def from_table(cls, table: pa.Table) -> "TokenData":
        return cls.from_columns(table.column)

    @classmethod
    def from_columns(cls, column: Callable[[str], pa.ChunkedArray]) -> "TokenData":
        """``column(name)`` gives each of :data:`TOKEN_COLUMNS` in turn: a caller reading them one at a time from
        the files holds one column's Arrow data at once, not the whole table's beside the arrays made from it."""
        p, p_off = _flat_list(column("prompt_token_ids"), np.int32)
        c, c_off = _flat_list(column("completion_token_ids"), np.int32)
        b, b_off = _flat_list(column("behavior_logprobs"), np.float32)
        adv = np.asarray(column("advantage").to_numpy(zero_copy_only=False), dtype=np.float32)
        w = np.asarray(column("weight").to_numpy(zero_copy_only=False), dtype=np.float32)
        return cls(p, p_off, c, c_off, b, b_off, adv, w)

    @property
    def n_rows(self) -> int:
        return len(self.advantages)

    @cached_property
    def prompt_lens(self) -> np.ndarray:
        return np.diff(self.prompt_off)

    @cached_property
    def completion_lens(self) -> np.ndarray:
        return np.diff(self.completion_off)

    @cached_property
    def seq_lens(self) -> np.ndarray:
        return self.prompt_lens + self.completion_lens


# -- units: rows that travel together --------------------------------------------


@dataclass
class Units:
    """The rows batching keeps together: single rows, a prompt's group, or a (chosen, rejected) pair.

    ``rows`` lists dataset rows unit after unit; unit u is
    ``rows[off[u]:off[u+1]]``, in that order (a pair: chosen first). A unit is
    never split over steps or ranks; one over the token budget is cut over
    micro-batches into pieces of ``piece`` rows (2: a pairwise loss needs a pair's
    two rows in one forward pass; a prompt's pairs are cut between pairs).
    """

    rows: np.ndarray  # (n,) int64
    off: np.ndarray  # (n_units + 1,) int64
    piece: int = 1

    @classmethod
    def singletons(cls, n_rows: int) -> "Units":
        return cls(np.arange(n_rows, dtype=np.int64), np.arange(n_rows + 1, dtype=np.int64))

    @classmethod
    def from_labels(cls, labels: np.ndarray, *, piece: int = 1) -> "Units":
        """Rows with equal ``labels`` (int (n,)) form a unit; units in order of first row, rows in file order."""
        labels = np.asarray(labels)
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")[inverse]  # unit number by first row
        rows = np.argsort(rank, kind="stable").astype(np.int64)
        off = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=len(first)))]).astype(np.int64)
        return cls(rows, off, piece)

    @property
    def n_units(self) -> int:
        return len(self.off) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.off)

    def rows_of(self, units: np.ndarray) -> np.ndarray:
        """The rows of ``units`` (int (k,)), unit after unit."""
        if len(units) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self.rows[self.off[u] : self.off[u + 1]] for u in units])

    def longest(self, lengths: np.ndarray) -> np.ndarray:
        """(n_units,) the longest row of each unit, by ``lengths`` (n_rows,)."""
        return np.maximum.reduceat(lengths[self.rows], self.off[:-1]) if len(self.rows) else np.zeros(0, np.int64)


# -- data order ----------------------------------------------------------------


@dataclass
class StepPlan:
    """Which units each optimizer step trains on: step k takes ``order[starts[k]:starts[k+1]]``.

    The order is a stream of seeded per-epoch permutations of the units (seed,
    epoch), so step k always gets the same units and a resumed run needs only
    the step number. A step takes whole units while they fit ``batch_size``
    rows; a unit larger than ``batch_size`` gets a step of its own.
    """

    order: np.ndarray  # (units consumed,) unit ids
    starts: np.ndarray  # (steps + 1,)
    rows_done: np.ndarray  # (steps + 1,) rows consumed before step k

    @property
    def steps(self) -> int:
        return len(self.starts) - 1

    def step_units(self, step: int) -> np.ndarray:
        return self.order[self.starts[step] : self.starts[step + 1]]


def step_plan(units: Units, batch_size: int, epochs: float, max_steps: Optional[int], seed: int) -> StepPlan:
    """The run's steps: ``max_steps`` of them if given (it overrides ``epochs``, as in HF), else as many
    as the first ``round(epochs · n_units)`` units of the stream take."""
    n, sizes = units.n_units, units.sizes
    if max_steps is None:
        order = _unit_stream(n, round(epochs * n), seed)
        starts = _cut_steps(sizes[order], batch_size)
    else:  # grow the stream until it fills max_steps steps
        wanted = max_steps * batch_size
        while True:
            order = _unit_stream(n, wanted, seed)
            starts = _cut_steps(sizes[order], batch_size)
            if len(starts) - 1 >= max_steps or n == 0:
                break
            wanted *= 2
        starts = starts[: max_steps + 1]
        order = order[: starts[-1]]
    rows_done = np.concatenate([[0], np.cumsum(sizes[order])])[starts]
    return StepPlan(order, starts, rows_done.astype(np.int64))


def _unit_stream(n_units: int, count: int, seed: int) -> np.ndarray:
    """permutation(epoch 0) ++ permutation(epoch 1) ++ ..., each seeded by (seed, epoch), cut to ``count``."""
    chunks, have, epoch = [], 0, 0
    while have < count and n_units:
        chunks.append(np.random.default_rng([seed, epoch]).permutation(n_units))
        have += n_units
        epoch += 1
    return np.concatenate(chunks)[:count].astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)


def _cut_steps(sizes: np.ndarray, batch_size: int) -> np.ndarray:
    """Step boundaries (steps + 1,) over a stream of units of ``sizes``: whole units, ≤ batch_size rows a step
    (a larger unit alone)."""
    if len(sizes) and (sizes == 1).all():  # single rows: plain slices of batch_size
        return np.unique(np.concatenate([np.arange(0, len(sizes), batch_size), [len(sizes)]])).astype(np.int64)
    starts, rows = [0], 0
    for i, size in enumerate(sizes.tolist()):
        if rows and rows + size > batch_size:
            starts.append(i)
            rows = 0
        rows += size
    if rows:
        starts.append(len(sizes))
    return np.asarray(starts, dtype=np.int64)


# -- ranks and micro-batches ----------------------------------------------------


def split_units(units_in_step: np.ndarray, longest: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Deal a step's units over ranks, longest first, round-robin (balances tokens per rank)."""
    if world_size == 1:
        return [units_in_step]
    ordered = units_in_step[np.argsort(-longest[units_in_step], kind="stable")]
    return [ordered[r::world_size] for r in range(world_size)]


def pack_units(units_in_rank: np.ndarray, units: Units, lengths: np.ndarray, token_budget: int,
               prompt_lens: Optional[np.ndarray] = None, longest: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """Greedy packing, longest unit first, while the micro-batch's padded cost ≤ budget.

    Cost: rows × longest row; with ``prompt_lens`` (n_rows,) — the shared-prefix layout, where
    ``lengths`` are completion lengths and a unit is one prompt's rows — prompts × longest prompt
    + rows × longest completion, each prompt counted once. Returns the rows of each micro-batch,
    unit after unit. A unit over the budget is cut into pieces that fit, longest first, in multiples
    of ``units.piece`` rows (a single piece over the budget gets a micro-batch of its own). ``longest``
    (n_units,): each unit's longest row by that cost, if the caller has it (:func:`unit_longest`).
    """
    if len(units_in_rank) == 0:
        return []
    shared = prompt_lens is not None
    size = (lambda r: lengths[r] + prompt_lens[r]) if shared else (lambda r: lengths[r])  # noqa: E731
    longest = unit_longest(units, lengths, prompt_lens) if longest is None else longest
    ordered = units_in_rank[np.argsort(-longest[units_in_rank], kind="stable")]

    def cost(parts: list[np.ndarray]) -> int:
        rows = np.concatenate(parts)
        if not shared:
            return len(rows) * max(int(lengths[rows].max()), 1)
        return len(parts) * int(prompt_lens[rows].max()) + len(rows) * max(int(lengths[rows].max()), 1)

    batches: list[np.ndarray] = []
    current: list[np.ndarray] = []
    for u in ordered:
        rows = units.rows[units.off[u] : units.off[u + 1]]
        if current and cost(current + [rows]) > token_budget:
            batches.append(np.concatenate(current))
            current = []
        if not current and len(rows) > units.piece and cost([rows]) > token_budget:
            by_piece = rows.reshape(-1, units.piece)  # a pair stays (chosen, rejected)
            rows = by_piece[np.argsort(-size(by_piece).max(1), kind="stable")].reshape(-1)  # longest first: later pieces cost less
            pieces = _cut(rows, lambda k: cost([rows[:k]]), token_budget, units.piece)
            batches += pieces[:-1]
            rows = pieces[-1]
        current.append(rows)
    batches.append(np.concatenate(current))
    return batches


def _cut(rows: np.ndarray, cost_of_first, budget: int, piece: int = 1) -> list[np.ndarray]:
    """``rows`` in pieces of k rows, the largest multiple k (≥ ``piece``) of ``piece`` whose cost fits the budget."""
    k = piece
    while k < len(rows) and cost_of_first(k + piece) <= budget:
        k += piece
    return [rows[i : i + k] for i in range(0, len(rows), k)]


def unit_longest(units: Units, lengths: np.ndarray, prompt_lens: Optional[np.ndarray] = None) -> np.ndarray:
    """(n_units,) each unit's longest row by packing's cost (with ``prompt_lens``: prompt + completion)."""
    return units.longest(lengths if prompt_lens is None else lengths + prompt_lens)


def plan_micro_batches(
    units_in_step: np.ndarray, units: Units, lengths: np.ndarray, world_size: int, token_budget: int,
    prompt_lens: Optional[np.ndarray] = None, longest: Optional[np.ndarray] = None,
) -> list[list[np.ndarray]]:
    """Micro-batches (their rows) of every rank, padded with empty ones to the same count.

    Every rank computes the whole plan (it holds the whole dataset), so the
    count is agreed on without communication. ``prompt_lens``: the shared-prefix
    cost (see :func:`pack_units`; ``lengths`` are then completion lengths). ``longest``: once a run (it reads every row).
    """
    longest = unit_longest(units, lengths, prompt_lens) if longest is None else longest
    per_rank = [pack_units(r, units, lengths, token_budget, prompt_lens, longest) for r in split_units(units_in_step, longest, world_size)]
    count = max(1, max(len(p) for p in per_rank))
    empty = np.zeros(0, dtype=np.int64)
    return [p + [empty] * (count - len(p)) for p in per_rank]


# -- denominators (how micro-batch losses add up to the step's loss) -------------


def loss_denominator(data: TokenData, rows: np.ndarray, aggregation: str) -> float:
    """The normaliser ``aggregate`` divides by, for the rows ``rows``.

    token-mean: Σ w_i L_i;  seq-mean-*: Σ_{L_i>0} w_i.  A micro-batch's loss
    times its denominator, divided by the step's, is its exact share of the
    step's loss: Σ_mb loss_mb · D_mb / D_step = loss over the whole step batch.
    """
    if len(rows) == 0:
        return 0.0
    w = data.weights[rows].astype(np.float64)
    lens = data.completion_lens[rows]
    if aggregation == "token-mean":
        return float((w * lens).sum())
    return float((w * (lens > 0)).sum())


# -- one micro-batch --------------------------------------------------------------


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (B, T) int64, prompt + completion, right-padded
    prompt_lens: torch.Tensor  # (B,) int64
    completion_lens: torch.Tensor  # (B,) int64
    mask: torch.Tensor  # (B, C) float32, 1 on completion tokens
    behavior: torch.Tensor  # (B, C) float32 log μ (0 on padding)
    advantages: torch.Tensor  # (B,) float32
    weights: torch.Tensor  # (B,) float32
    ref: Optional[torch.Tensor]  # (B, C) float32 log ref, or None
    rows: np.ndarray  # (B,) dataset row indices (empty for a padding micro-batch)
    n_tokens: int  # real tokens (prompt + completion) the rows hold
    n_completion_tokens: int
    # Shared prefix (see :func:`collate_shared`): input_ids (B, C) are the completions, prompt_lens (P,).
    prompt_ids: Optional[torch.Tensor] = None  # (P, Lp) distinct prompts, left-padded
    group: Optional[torch.Tensor] = None  # (B,) each row's prompt
    n_computed: int = 0  # tokens the forward computes (shared prefix: each prompt once)

    def to(self, device: torch.device) -> "MicroBatch":
        if device.type == "cpu":
            return self
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return MicroBatch(
            move(self.input_ids), move(self.prompt_lens), move(self.completion_lens), move(self.mask),
            move(self.behavior), move(self.advantages), move(self.weights), move(self.ref),
            self.rows, self.n_tokens, self.n_completion_tokens, move(self.prompt_ids), move(self.group), self.n_computed,
        )

    def prefix(self) -> dict[str, Optional[torch.Tensor]]:
        """The shared-prefix keywords of the policy's forward (empty for the one-pass layout)."""
        return {} if self.prompt_ids is None else {"prompt_ids": self.prompt_ids, "group": self.group}


def collate(
    data: TokenData,
    rows: np.ndarray,
    *,
    pad_id: int = 0,
    behavior: Optional[np.ndarray] = None,
    ref: Optional[np.ndarray] = None,
    advantages: Optional[np.ndarray] = None,
) -> MicroBatch:
    """Pad ``rows`` into one micro-batch (layout in the module docstring).

    ``behavior``/``ref`` are flat per-completion-token arrays aligned with
    ``data.completion_off`` (default: the stored μ; no ref). ``advantages``
    (n_rows,) overrides the stored ones (step-level whitening). An empty
    ``rows`` gives a 1-row batch with no completion tokens and weight 0.
    """
    if len(rows) == 0:
        z = torch.zeros(1, 1)
        return MicroBatch(
            torch.full((1, 2), pad_id, dtype=torch.long), torch.ones(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long), z, z.clone(), torch.zeros(1), torch.zeros(1),
            None if ref is None else z.clone(), rows, 0, 0,
        )
    beh = data.behavior if behavior is None else behavior
    adv = data.advantages if advantages is None else advantages
    p_off, c_off = data.prompt_off, data.completion_off
    p_len = (p_off[rows + 1] - p_off[rows]).astype(np.int64)
    c_len = (c_off[rows + 1] - c_off[rows]).astype(np.int64)
    # One column past the longest prompt, so at least one logit is kept even if no row has a completion.
    B, T, C = len(rows), int(max((p_len + c_len).max(), p_len.max() + 1)), max(int(c_len.max()), 1)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    mu = np.zeros((B, C), dtype=np.float32)
    mask = np.zeros((B, C), dtype=np.float32)
    rf = None if ref is None else np.zeros((B, C), dtype=np.float32)
    for i, r in enumerate(rows):
        pl, cl = p_len[i], c_len[i]
        ids[i, :pl] = data.prompt_ids[p_off[r] : p_off[r + 1]]
        ids[i, pl : pl + cl] = data.completion_ids[c_off[r] : c_off[r + 1]]
        mu[i, :cl] = beh[c_off[r] : c_off[r + 1]]
        mask[i, :cl] = 1.0
        if rf is not None:
            rf[i, :cl] = ref[c_off[r] : c_off[r + 1]]
    return MicroBatch(
        torch.from_numpy(ids), torch.from_numpy(p_len), torch.from_numpy(c_len), torch.from_numpy(mask),
        torch.from_numpy(mu), torch.from_numpy(np.ascontiguousarray(adv[rows], dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(data.weights[rows], dtype=np.float32)),
        None if rf is None else torch.from_numpy(rf), rows, int((p_len + c_len).sum()), int(c_len.sum()),
        n_computed=int((p_len + c_len).sum()),
    )


def distinct_prompts(data: TokenData, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one row per distinct prompt (P,), each row's prompt index (B,)): rows with equal prompt tokens share."""
    seen: dict[bytes, int] = {}
    first, group = [], np.empty(len(rows), dtype=np.int64)
    for i, r in enumerate(rows):
        key = data.prompt_ids[data.prompt_off[r] : data.prompt_off[r + 1]].tobytes()
        if key not in seen:
            seen[key] = len(first)
            first.append(r)
        group[i] = seen[key]
    return np.asarray(first, dtype=np.int64), group


def collate_shared(data: TokenData, rows: np.ndarray, *, pad_id: int = 0, **kw) -> MicroBatch:
    """:func:`collate` for the shared-prefix forward: each distinct prompt once, left-padded (P, Lp),
    and the completions alone, right-padded (B, C); per-token tensors as in :func:`collate`."""
    mb = collate(data, rows, pad_id=pad_id, **kw)
    if len(rows) == 0:  # still two passes, so FSDP ranks gather each layer as often as the others
        mb.input_ids, mb.prompt_lens = torch.full((1, 1), pad_id, dtype=torch.long), torch.ones(1, dtype=torch.long)
        mb.prompt_ids, mb.group = torch.full((1, 1), pad_id, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        return mb
    first, group = distinct_prompts(data, rows)
    p_len = np.diff(data.prompt_off)[first]
    prompts = np.full((len(first), int(p_len.max())), pad_id, dtype=np.int64)
    for j, r in enumerate(first):
        prompts[j, prompts.shape[1] - p_len[j] :] = data.prompt_ids[data.prompt_off[r] : data.prompt_off[r + 1]]
    c_len = mb.completion_lens.numpy()
    C = max(int(c_len.max()), 1)
    completions = np.full((len(rows), C), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        completions[i, : c_len[i]] = data.completion_ids[data.completion_off[r] : data.completion_off[r + 1]]
    mb.input_ids, mb.prompt_lens = torch.from_numpy(completions), torch.from_numpy(p_len.astype(np.int64))
    mb.prompt_ids, mb.group = torch.from_numpy(prompts), torch.from_numpy(group)
    mb.n_computed = int(p_len.sum() + c_len.sum())
    return mb
