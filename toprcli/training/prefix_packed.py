"""Shared-prefix forward for FlexAttention: prompts and completions packed, masked blocks skipped.

The same hidden states as :func:`toprcli.training.prefix.shared_prefix_hidden`, in the layout a
block-sparse kernel wants (the pattern of FlexAttention's document masking). Used when the
decoder runs ``attn_implementation="flex_attention"``, which the trainer picks on CUDA with a
shared prefix (:func:`attention_for`).

1. **Prompts**, packed without padding into one row (1, Sp), Sp = Σ prompt lengths, positions
   restarting at 0 per prompt; each token attends causally within its own prompt. Each layer's
   keys/values (1, h_kv, Sp, d) are recorded with their gradient (:class:`~.prefix.PromptKV`).
2. **Completions**, packed into one row (1, Sc) at positions ``prompt_len + j``; each layer
   attends to ``cat(all prompt keys, own keys)`` (1, h_kv, Sp + Sc, d): no per-completion copy of
   its prompt. The mask lets completion token j of row b see the real tokens of prompt
   ``group[b]`` and tokens 0..j of row b.

The mask is a ``mask_mod`` (a function of query and key index). FlexAttention turns it into a
:class:`~torch.nn.attention.flex_attention.BlockMask` and skips every 128×128 block it rules
out: with 8 prompts of 350 tokens and 8 verdicts of 40 each (a verifier-like micro-batch)
85% of the completions' score blocks. Any other attention implementation gets the same
``mask_mod`` materialised as a dense boolean mask (Sc × (Sp + Sc)): correct, but it computes
the blocks the kernel skips, which is why the CPU trainer uses the padded layout of
``prefix.py`` instead. That dense form is how the packed layout's gradient is tested on CPU:
PyTorch's FlexAttention has no CPU backward. Not run on a GPU here.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from toprcli.training.logprobs import completion_index
from toprcli.training.prefix import PromptKV, allow_cache_under_checkpointing, attention_mask

FLEX = "flex_attention"


def attention_for(device: torch.device) -> Optional[str]:
    """The attention implementation a shared-prefix trainer asks Hugging Face for on ``device``:
    FlexAttention on CUDA (block-sparse, with a backward), else the model's default."""
    return FLEX if device.type == "cuda" else None


def uses_flex(decoder: torch.nn.Module) -> bool:
    return getattr(getattr(decoder, "config", None), "_attn_implementation", None) == FLEX


class PackedPrefixKV:
    """A read-only cache for the packed completion pass: every prompt's keys/values, then its own."""

    is_compileable = False
    is_sliding: list[bool] = []

    def __init__(self, prompt: PromptKV) -> None:
        self.prompt = prompt

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        k = torch.cat([self.prompt.keys[layer_idx].to(key_states.dtype), key_states], dim=2)
        v = torch.cat([self.prompt.values[layer_idx].to(value_states.dtype), value_states], dim=2)
        return k, v  # (1, h_kv, Sp + Sc, d); nothing stored, so a checkpoint replay is identical

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def block_mask(mask_mod: Callable, q_len: int, kv_len: int, decoder: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    """``mask_mod`` in the form the decoder's attention takes: a BlockMask for FlexAttention,
    else the dense 4-D mask of :func:`~.prefix.attention_mask`."""
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    if uses_flex(decoder):
        # Compiled on CUDA (as Hugging Face builds its own BlockMasks), so the mask is evaluated block by
        # block instead of materialised as q_len × kv_len index tensors first.
        return create_block_mask(mask_mod, B=1, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=device, _compile=device.type == "cuda")
    return attention_mask(decoder, create_mask(mask_mod, 1, None, q_len, kv_len, device=device)[:, 0], dtype)


def packed_prefix_hidden(decoder: torch.nn.Module, prompt_ids: torch.Tensor, prompt_lens: torch.Tensor, completion_ids: torch.Tensor,
                         group: torch.Tensor, completion_lens: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The hidden states (B, C, H) that predict completion tokens 0..C−1, zero past each completion's
    length: the contract of :func:`~.prefix.shared_prefix_hidden`, computed packed (module docstring).
    ``prompt_ids`` (P, Lp) left-padded, ``completion_ids`` (B, C) right-padded, ``group`` (B,)."""
    dtype = dtype or next(decoder.parameters()).dtype
    device = prompt_ids.device
    allow_cache_under_checkpointing(decoder)
    B, C = completion_ids.shape
    completion_lens = completion_lens if completion_lens is not None else torch.full((B,), C, device=device)

    # Each real token's row and index within it (completion_index lists the tokens of rows of given lengths).
    p_doc, p_pos, _ = completion_index(torch.ones_like(prompt_lens), prompt_lens)  # (Sp,) each
    p_tok = prompt_ids[p_doc, prompt_ids.shape[1] - prompt_lens[p_doc] + p_pos]  # left-padded: real tokens at the end
    Sp = len(p_tok)

    def prompt_mask(b, h, q, kv):  # causal within each prompt
        return (p_doc[q] == p_doc[kv]) & (kv <= q)

    kv = PromptKV()
    hidden = decoder(input_ids=p_tok[None], attention_mask=block_mask(prompt_mask, Sp, Sp, decoder, device, dtype),
                     position_ids=p_pos[None], past_key_values=kv, use_cache=False).last_hidden_state[0]  # (Sp, H)
    last = hidden[torch.cumsum(prompt_lens, 0) - 1]  # (P, H): each prompt's last token

    c_row, c_pos, _ = completion_index(torch.ones_like(completion_lens), completion_lens)  # (Sc,) each
    c_tok = completion_ids[c_row, c_pos]  # right-padded
    empty = len(c_tok) == 0
    if empty:  # still run the pass (one token, output unused), so FSDP ranks gather each layer as often as the others
        c_tok, c_row, c_pos = completion_ids[:1, 0], group.new_zeros(1), group.new_zeros(1)
    Sc, c_prompt = len(c_tok), group[c_row]  # c_prompt (Sc,): each completion token's prompt

    def completion_mask(b, h, q, kv):  # kv < Sp: a prompt token; else completion token kv − Sp
        in_prompt = kv < Sp
        kp, kc = kv.clamp(max=max(Sp - 1, 0)), (kv - Sp).clamp(min=0)
        return torch.where(in_prompt, p_doc[kp] == c_prompt[q], (c_row[kc] == c_row[q]) & (kc <= q))

    mask = block_mask(completion_mask, Sc, Sp + Sc, decoder, device, dtype)
    own = decoder(input_ids=c_tok[None], attention_mask=mask, position_ids=(prompt_lens[c_prompt] + c_pos)[None],
                  past_key_values=PackedPrefixKV(kv), use_cache=False).last_hidden_state[0]  # (Sc, H)
    out = hidden.new_zeros(B, C, hidden.shape[-1])  # (B, C, H)
    if not empty:
        out = out.index_put((c_row, c_pos), own)
    return torch.cat([last[group][:, None], out[:, :-1]], dim=1)  # (B, C, H)
