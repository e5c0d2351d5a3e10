"""Shared-prefix forward: the n completions of a prompt pay for the prompt once.

Pure tensor code over a Hugging Face decoder (no files, no config). A
micro-batch holds P distinct prompts and B completions, completion i
continuing prompt ``group[i]``. Two passes through the same decoder:

1. **Prompts** (P, Lp), *left*-padded, so every prompt ends at column Lp − 1.
   Each attention layer's keys and values (after RoPE) are recorded, with
   their gradient, by :class:`PromptKV`.
2. **Completions** (B, C), right-padded, at positions ``prompt_len + j``. Each
   layer attends to its prompt's recorded keys/values followed by its own,
   causally (:class:`PrefixKV` hands the layer ``cat(prompt_kv[group], own)``
   and stores nothing, so a gradient-checkpointing replay sees the same
   thing).

Completion token 0 is predicted by the prompt's last hidden state, token j ≥ 1
by the completion's hidden state j − 1: the hidden states that predict the
completion tokens are ``cat(prompt_last[group], completion_hidden[:, :-1])``,
the same vectors the one-pass layout (prompt + completion per row) computes,
up to summation order. The backward of the gather adds every completion's
gradient into its prompt's keys, values and last hidden state.

Attention masks are 4-D, which Hugging Face passes to the attention kernel as
is: boolean for SDPA (on CUDA it then picks its memory-efficient kernel, which
takes an arbitrary mask — not run here), additive for eager attention. A left
pad's query sees only itself; its output is never read.

Cost per micro-batch: Σ_a P_a · L_a + Σ_b n_b · C_b tokens through the MLPs
and projections (instead of B · (Lp + C)): prompts and completions each run
in buckets of similar length, padded to the bucket's longest (L_a, C_b;
:func:`length_buckets`); attention of the completions over Lp + C_b keys. The gathered prompt
keys/values are one copy per completion row and layer (B · Lp · 2 · kv_dim
values), which attention keeps for its backward.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

# A decoder call's fixed cost in tokens' worth of compute (30 layers' dispatch): what a bucket of rows
# must save in padding to be run apart (benchmarks/prefix.py: 64 beat 256 and one bucket on the verifier shape).
CALL_COST_TOKENS = 64
# The call cost that makes every pass one decoder call. Under FSDP2 each call gathers every layer, a
# collective, so all ranks must make the same number of calls whatever their rows' lengths.
ONE_CALL = float("inf")


class PromptKV:
    """A cache for the prompt pass: records each layer's keys/values (overwriting on a replay)."""

    is_compileable = False
    is_sliding: list[bool] = []

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states  # (P, h_kv, Lp, d)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class PrefixKV:
    """A read-only cache for the completion pass: each row's prompt keys/values before its own."""

    is_compileable = False
    is_sliding: list[bool] = []

    def __init__(self, prompt: PromptKV, group: torch.Tensor) -> None:
        self.prompt, self.group = prompt, group
        self.single = bool((group == group[0]).all()) if len(group) else True

    def _prefix(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        if self.single:  # one prompt: a broadcast view, no gather
            return t[self.group[:1]].expand(rows, *t.shape[1:])
        return t.index_select(0, self.group)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        rows = key_states.shape[0]
        k = torch.cat([self._prefix(self.prompt.keys[layer_idx], rows).to(key_states.dtype), key_states], dim=2)
        v = torch.cat([self._prefix(self.prompt.values[layer_idx], rows).to(value_states.dtype), value_states], dim=2)
        return k, v  # (B, h_kv, Lp + C, d); nothing stored, so a checkpoint replay is identical

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def attention_mask(decoder: torch.nn.Module, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, q, k) bool → the 4-D mask the decoder's attention takes as is: bool (True: attend) for SDPA
    (whatever autocast does to q and k), else additive in ``dtype`` (0, or the dtype's minimum)."""
    if getattr(getattr(decoder, "config", None), "_attn_implementation", "sdpa") == "sdpa":
        return allowed[:, None]
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, low)[:, None]


def prompt_pass(decoder: torch.nn.Module, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, dtype: torch.dtype):
    """Run the left-padded prompts (P, Lp); returns (last hidden state (P, H), their keys/values)."""
    P, Lp = prompt_ids.shape
    col = torch.arange(Lp, device=prompt_ids.device)
    start = (Lp - prompt_lens)[:, None]  # (P, 1) first real column
    real = col[None, :] >= start  # (P, Lp)
    causal = col[None, None, :] <= col[None, :, None]  # (1, q, k)
    # Real keys, causally; a left pad sees itself only (a row with no key would give NaN).
    allowed = (real[:, None, :] & causal) | torch.eye(Lp, dtype=torch.bool, device=prompt_ids.device)[None]
    positions = (col[None, :] - start).clamp(min=0)  # (P, Lp)
    kv = PromptKV()
    hidden = decoder(input_ids=prompt_ids, attention_mask=attention_mask(decoder, allowed, dtype), position_ids=positions,
                     past_key_values=kv, use_cache=False).last_hidden_state  # (P, Lp, H)
    return hidden[:, -1], kv


def prompt_passes(decoder: torch.nn.Module, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, dtype: torch.dtype,
                  call_cost: Optional[float] = None):
    """:func:`prompt_pass` over buckets of similar prompt length (:func:`length_buckets`), each left-padded
    to its own longest, so a 100-token prompt is not padded to its neighbour's 360. The buckets' keys and
    values are left-padded back to Lp (zeros, never attended: the completions' mask stops at each prompt's
    first real column) and put in prompt order: (P, H) and a :class:`PromptKV` of (P, h_kv, Lp, d)."""
    lens = prompt_lens.tolist()
    buckets = length_buckets(lens, call_cost)
    if len(buckets) == 1:
        return prompt_pass(decoder, prompt_ids, prompt_lens, dtype)
    Lp, lasts, kvs, order = prompt_ids.shape[1], [], [], []
    for rows in buckets:
        idx = torch.tensor(rows, device=prompt_ids.device)
        longest = max(lens[rows[-1]], 1)
        last, kv = prompt_pass(decoder, prompt_ids[idx, Lp - longest:], prompt_lens[idx], dtype)
        lasts.append(last)
        kvs.append(kv)
        order += rows
    back = torch.argsort(torch.tensor(order, device=prompt_ids.device))  # bucket order -> prompt order
    merged = PromptKV()
    for layer in kvs[0].keys:
        for mine, theirs in ((merged.keys, [kv.keys for kv in kvs]), (merged.values, [kv.values for kv in kvs])):
            padded = [torch.nn.functional.pad(t[layer], (0, 0, Lp - t[layer].shape[2], 0)) for t in theirs]
            mine[layer] = torch.cat(padded).index_select(0, back)  # (P, h_kv, Lp, d)
    return torch.cat(lasts).index_select(0, back), merged


def completion_pass(decoder: torch.nn.Module, completion_ids: torch.Tensor, prompt_lens: torch.Tensor, group: torch.Tensor,
                    kv: PromptKV, Lp: int, dtype: torch.dtype) -> torch.Tensor:
    """Run the right-padded completions (B, C) against their prompts' keys/values; hidden (B, C, H)."""
    B, C = completion_ids.shape
    plen = prompt_lens[group]  # (B,)
    pcol = torch.arange(Lp, device=completion_ids.device)
    ccol = torch.arange(C, device=completion_ids.device)
    prompt_keys = (pcol[None, :] >= (Lp - plen)[:, None])[:, None, :].expand(B, C, Lp)  # (B, C, Lp)
    own_keys = (ccol[None, :] <= ccol[:, None])[None].expand(B, C, C)  # (B, C, C) causal
    allowed = torch.cat([prompt_keys, own_keys], dim=-1)  # (B, C, Lp + C)
    positions = plen[:, None] + ccol[None, :]  # (B, C)
    return decoder(input_ids=completion_ids, attention_mask=attention_mask(decoder, allowed, dtype), position_ids=positions,
                   past_key_values=PrefixKV(kv, group), use_cache=False).last_hidden_state


def allow_cache_under_checkpointing(decoder: torch.nn.Module) -> None:
    """Let gradient-checkpointed layers keep our caches: both are safe to replay (PromptKV overwrites,
    PrefixKV stores nothing), and Hugging Face otherwise drops any cache under checkpointing."""
    for module in decoder.modules():
        if hasattr(module, "_can_checkpoint_with_cache"):
            module._can_checkpoint_with_cache = True


def unsupported(config: Any, longest: int, checkpointing: bool) -> str | None:
    """Why the shared layout would not give the one-pass layout's log-probs for this model, else None: one mask
    for every layer ignores a sliding window narrower than the ``longest`` sequence and non-attention layers
    (linear attention, convolutions); decoders whose blocks are not in ``.layers`` (GPT-2's ``.h``) drop the
    prompt's cache themselves under gradient checkpointing."""
    types = set(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None) if types - {"full_attention"} or not types and getattr(config, "use_sliding_window", True) else None
    if types - {"full_attention", "sliding_attention"}:
        return f"its layers include {', '.join(sorted(types - {'full_attention', 'sliding_attention'}))}, which the shared layout does not run"
    if window is not None and window < longest:
        return f"its sliding window ({window} tokens) is shorter than the longest sequence ({longest}), and the shared layout masks no window"
    if checkpointing:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):  # the module tree only: no memory, no weights
            base = AutoModelForCausalLM.from_config(config).base_model
        if not hasattr(base, "layers"):
            return "its decoder drops the prompt's cache under gradient checkpointing (pass --no-gradient-checkpointing)"
    return None


def length_buckets(lengths: list[int], call_cost: Optional[float] = None) -> list[list[int]]:
    """Rows grouped into runs of similar length, each run padded to its longest: the grouping of the
    sorted lengths that minimises Σ (rows · longest + ``call_cost``), a decoder call costing about as
    much as ``call_cost`` tokens (default :data:`CALL_COST_TOKENS`). Exact (dynamic programming over cut
    points, O(n²)); rows of each bucket by length, buckets shortest first."""
    call_cost = CALL_COST_TOKENS if call_cost is None else call_cost
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if call_cost == ONE_CALL:
        return [order]
    best, cut = [0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):  # the last bucket is order[i:j]
            cost = best[i] + (j - i) * longest + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets, j = [], len(order)
    while j > 0:
        buckets.append(order[cut[j]:j])
        j = cut[j]
    return buckets[::-1]


def shared_prefix_hidden(decoder: torch.nn.Module, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, completion_ids: torch.Tensor,
                         group: torch.Tensor, completion_lens: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None,
                         call_cost: Optional[float] = None) -> torch.Tensor:
    """The hidden states (B, C, H) that predict completion tokens 0..C−1 (see the module docstring); zero past
    each completion's length. Prompts and completions run in buckets of similar length (:func:`length_buckets`
    with ``call_cost``; :data:`ONE_CALL`: one decoder call each), so a micro-batch of short and long
    completions does not pad every row to the longest."""
    dtype = dtype or next(decoder.parameters()).dtype
    allow_cache_under_checkpointing(decoder)
    last, kv = prompt_passes(decoder, prompt_ids, prompt_lens, dtype, call_cost)
    B, C = completion_ids.shape
    lens = completion_lens.tolist() if completion_lens is not None else [C] * B
    parts, order = [], []
    for rows in length_buckets(lens, call_cost):
        idx = torch.tensor(rows, device=completion_ids.device)
        c = max(lens[rows[-1]], 1)  # the bucket's longest
        hidden = completion_pass(decoder, completion_ids[idx, :c], prompt_lens, group[idx], kv, prompt_ids.shape[1], dtype)  # (n, c, H)
        parts.append(torch.nn.functional.pad(hidden, (0, 0, 0, C - c)))
        order += rows
    hidden = torch.cat(parts).index_select(0, torch.argsort(torch.tensor(order, device=completion_ids.device)))  # (B, C, H), rows in order
    return torch.cat([last[group][:, None], hidden[:, :-1]], dim=1)  # (B, C, H)
