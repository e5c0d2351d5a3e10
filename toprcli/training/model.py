"""The policy being trained: loading, precision, FSDP2 placement, and log π of completions.

Reads the starting model (HF dir or hub id); writes nothing.

:class:`PolicyLogprobs` wraps a causal LM so that its forward returns log π of
the completion tokens under the data's sampling processing, with the LM head
applied in chunks (``training/logprobs.py``). It is the module that is trained
and, under torchrun, the FSDP2 root: decoder layers are sharded one by one and
the wrapper holds the embeddings, final norm and head, so calling it runs
FSDP's gather/release hooks around the whole computation.

Precision (``TrainConfig.dtype``):

* ``float32``: everything in float32.
* ``bfloat16``: float32 master weights, gradients and optimizer arithmetic;
  the forward and backward run in bf16 (autocast in one process, FSDP2's
  ``MixedPrecisionPolicy`` under torchrun). Small updates survive (lr 5e-7).
* ``bfloat16-pure``: weights themselves in bf16 — half the memory, but an
  update below ~2^-8 of a weight rounds away (a warning says so).
* ``auto``: float32 on CPU, ``bfloat16`` on GPU.

FSDP2 start-up like the big frameworks: every rank builds the model on the
meta device (no memory) and shards it, then reads its own piece of each
tensor straight from the safetensors checkpoint (a slice of a memory map), so
no rank ever holds a whole model, or even one whole tensor. With LoRA (the adapters' initialisation is not in the checkpoint) rank
0 loads the model in full and broadcasts it into the shards instead.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from toprcli.errors import UserError
from toprcli.generation.model_info import first_line
from toprcli.sampling import Processing
from toprcli.training.checkpoint import quiet_hf
from toprcli.training.distributed import DistContext, broadcast_object, every_rank, shard_model
from toprcli.training.logprobs import chunked_logprobs, completion_index, default_chunk_size, scatter_completion
from toprcli.training.lora import apply_lora, check_lora_targets, lora_config
from toprcli.training.prefix import ONE_CALL, shared_prefix_hidden
from toprcli.training.prefix_packed import packed_prefix_hidden, uses_flex


@dataclass(frozen=True)
class Precision:
    """How weights are stored and how the forward computes."""

    name: str  # float32 | bfloat16 | bfloat16-pure
    device_type: str

    @classmethod
    def resolve(cls, dtype: str, device: torch.device) -> "Precision":
        if dtype == "auto":  # bf16 autocast on a GPU without it (before Ampere) would be emulated, slowly: float32 there
            dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False) else "float32"
        return cls(dtype, device.type)

    @property
    def weight_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bfloat16-pure" else torch.float32

    @property
    def mixed(self) -> bool:
        return self.name == "bfloat16"

    def autocast(self, distributed: bool):
        """The forward's context: bf16 autocast for mixed precision in one process (FSDP2 casts itself)."""
        if self.mixed and not distributed:  # no cast cache: it holds a bf16 copy of every weight (16 GB at 8B) for the whole forward
            return torch.autocast(self.device_type, dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()


def _logit_transform(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a model does to its head's output before the softmax (scaling, soft-capping)."""
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)  # Cohere: multiplies
    divisor = getattr(config, "logits_scaling", None)  # Granite: divides

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale:
            logits = logits * scale
        if divisor:
            logits = logits / divisor
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


class PolicyLogprobs(torch.nn.Module):
    """A causal LM whose forward gives log π (and entropy) of the completion tokens, (B, C)."""

    def __init__(self, lm: torch.nn.Module, processing: Processing, chunk_size: Optional[int] = None, *, sharded: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.processing = processing
        # Sharded (FSDP2): every rank makes the same decoder calls, so a shared prefix runs unbucketed.
        self.prefix_call_cost = ONE_CALL if sharded else None
        # A shared prefix runs packed under FlexAttention (block-sparse), padded otherwise (training/prefix*.py).
        self.packed_prefix = uses_flex(lm.get_decoder()) if hasattr(lm, "get_decoder") else False
        config = getattr(lm, "config", None)
        vocab = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config, "vocab_size", 32768)
        self.chunk_size = chunk_size or default_chunk_size(int(vocab))
        self._transform = _logit_transform(config)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._transform(self.lm.get_output_embeddings()(hidden))

    def forward(
        self,
        input_ids: torch.Tensor,
        prompt_lens: torch.Tensor,
        completion_lens: torch.Tensor,
        with_entropy: bool = False,
        prompt_ids: Optional[torch.Tensor] = None,
        group: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``input_ids`` (B, T): prompt_i + completion_i, right-padded (causal attention, so the
        padding is never seen). Returns ``(logprobs (B, C), entropy (B, C) or None)``,
        C = max(max_i c_i, 1), zero past each completion.

        Shared prefix (``prompt_ids`` given): ``input_ids`` (B, C) holds the completions only,
        ``prompt_ids`` (P, Lp) the distinct prompts left-padded, ``prompt_lens`` (P,) their lengths
        and ``group`` (B,) each completion's prompt (``training/prefix.py``)."""
        B = input_ids.shape[0]
        C = max(int(completion_lens.max()), 1)
        if prompt_ids is not None:
            shared_hidden = packed_prefix_hidden if self.packed_prefix else shared_prefix_hidden
            bucketing = {} if self.packed_prefix else {"call_cost": self.prefix_call_cost}  # packed: always two calls
            hidden = shared_hidden(self.lm.get_decoder(), prompt_ids, prompt_lens, input_ids, group, completion_lens, **bucketing)  # (B, C, H)
            rows, cols, positions = completion_index(torch.ones_like(completion_lens), completion_lens)  # position j ← hidden j
            input_ids = torch.cat([input_ids[:, :1], input_ids], dim=1)  # so that input_ids[rows, positions + 1] is token j
        else:
            rows, cols, positions = completion_index(prompt_lens, completion_lens)  # (P,) each
            hidden = self.lm.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state  # (B, T, H)
        if len(rows) == 0:
            # No completion token (an empty micro-batch that keeps FSDP ranks in step): still run the
            # head once, weighted 0, so every rank's head gradient exists and reductions match.
            zero = self.head_logits(hidden[:1, :1]).float().sum() * 0.0
            out = hidden.new_zeros(B, C, dtype=torch.float32) + zero
            return out, (out.clone() if with_entropy else None)
        targets = input_ids[rows, positions + 1]  # (P,)
        lp, ent = chunked_logprobs(
            hidden[rows, positions], targets, self.head_logits, self.processing,
            chunk_size=self.chunk_size, with_entropy=with_entropy,
        )
        logprobs = scatter_completion(lp, rows, cols, B, C)
        entropy = scatter_completion(ent, rows, cols, B, C) if ent is not None else None
        return logprobs, entropy


# -- loading ----------------------------------------------------------------------


def _disable_dropout(model: torch.nn.Module) -> None:
    # π must be a deterministic function of the weights: the ratio π/μ compares it with the sampler.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


def _load_lm(model: str, dtype: torch.dtype, *, on_meta: bool, attention: Optional[str] = None) -> torch.nn.Module:
    if attention:
        try:
            return _load_lm_with(model, dtype, on_meta, {"attn_implementation": attention})
        except ValueError as e:  # an architecture without it: Hugging Face refuses before loading weights
            warnings.warn(f"{model}: attention {attention!r} is not available ({str(e).splitlines()[0]}); using the model's default", stacklevel=2)
    return _load_lm_with(model, dtype, on_meta, {})  # the model's own default (SDPA)


def _load_lm_with(model: str, dtype: torch.dtype, on_meta: bool, kw: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    with quiet_hf():
        if not on_meta:
            try:
                return AutoModelForCausalLM.from_pretrained(model, dtype=dtype, **kw)
            except Exception as e:  # no weights, a hub id not there, a damaged file (safetensors' own error): one line naming it
                if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                    raise
                raise UserError(f"cannot load the model {model} ({first_line(e)}) — pass a directory with its weights "
                                "(model.safetensors), or a hub id") from None
        from accelerate import init_empty_weights

        # Parameters on the meta device (no memory); buffers (rotary tables) real, as the
        # checkpoint does not hold the non-persistent ones.
        with init_empty_weights(include_buffers=False):
            lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=dtype, **kw)
        lm.tie_weights()  # meta initialisation loses the tie (tied embeddings must be one parameter, as on rank 0)
        return lm


def _materialize(module: torch.nn.Module, device: torch.device) -> None:
    """Give meta parameters real (uninitialised) storage on ``device``, keeping the buffers."""
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    module.to_empty(device=device)
    with torch.no_grad():
        for name, value in buffers.items():
            owner, _, attr = name.rpartition(".")
            getattr(module.get_submodule(owner) if owner else module, attr).copy_(value)


def load_policy(
    model: str,
    ctx: DistContext,
    precision: Precision,
    processing: Processing,
    *,
    gradient_checkpointing: bool = False,
    lora: Optional[dict[str, Any]] = None,
    chunk_size: Optional[int] = None,
    trainable: bool = True,
    attention: Optional[str] = None,
) -> tuple[PolicyLogprobs, Any]:
    """The starting policy wrapped in :class:`PolicyLogprobs`, placed and sharded.

    ``lora``: ``{"rank", "alpha", "dropout", "target_modules"}`` to train LoRA
    adapters (base weights frozen). ``attention``: Hugging Face's ``attn_implementation``
    (unset: the model's default). Returns ``(policy, lora_config or None)``.
    """
    # Under torchrun, full fine-tuning streams the checkpoint into the shards (every rank builds the model on
    # the meta device); LoRA adapters, or names the checkpoint lacks, fall back to a full load on rank 0
    # broadcast into the shards.
    files = checkpoint_files(model) if ctx.distributed and not lora else []
    if ctx.distributed and not lora and not every_rank(bool(files), ctx):  # streamed on every rank, or loaded on rank 0
        files = []
    streamed = False
    if files:
        probe = _load_lm(model, precision.weight_dtype, on_meta=True)
        streamed = bool(broadcast_object(_streamable(probe, files) if ctx.is_main else None, ctx))
        del probe
    meta = ctx.distributed and (streamed or not ctx.is_main)
    lm = _load_lm(model, precision.weight_dtype, on_meta=meta, attention=attention)
    _disable_dropout(lm)
    lcfg = None
    if trainable:
        if gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            check_lora_targets(lm, lora.get("target_modules"))
            lcfg = lora_config(lora["rank"], lora["alpha"], lora["dropout"], lora.get("target_modules"))
            lm = apply_lora(lm, lcfg)
        lm.train()
    else:
        lm.requires_grad_(False)
        lm.eval()
    policy = PolicyLogprobs(lm, processing, chunk_size, sharded=ctx.distributed)
    if not ctx.distributed:
        return policy.to(ctx.device), lcfg
    if streamed:
        shard_model(policy, ctx, bf16=precision.mixed)
        _materialize(policy, ctx.device)
        _stream_checkpoint_into_shards(policy, files, ctx, precision.weight_dtype)
        return policy, lcfg
    full = policy.state_dict() if ctx.is_main else {}  # rank 0's weights, to broadcast into the shards
    shard_model(policy, ctx, bf16=precision.mixed)
    if not ctx.is_main:
        _materialize(policy, ctx.device)
    elif ctx.device.type != "cpu":
        policy.to(ctx.device)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(policy, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    return policy, lcfg


# -- FSDP2: weights streamed from the checkpoint into the shards --------------------------


def checkpoint_files(model: str) -> list[Path]:
    """The safetensors files of a local model dir (or a hub id's cached snapshot); [] if there are none."""
    root = Path(model)
    if not root.is_dir():
        try:
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(model, allow_patterns=["*.safetensors", "*.json"]))
        except Exception:  # offline, gated, ...: the rank-0 full load reports the real error
            return []
    return sorted(root.glob("*.safetensors"))


def _checkpoint_keys(files: list[Path]) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            keys.update(st.keys())
    return keys


def _streamable(lm: torch.nn.Module, files: list[Path]) -> bool:
    """Every parameter of the model is a tensor of the checkpoint (tied aliases aside)."""
    if not files:
        return False
    keys = _checkpoint_keys(files)
    return all(name in keys for name, _ in lm.named_parameters())  # named_parameters() lists a tied weight once


def _stream_checkpoint_into_shards(policy: PolicyLogprobs, files: list[Path], ctx: DistContext, dtype: torch.dtype) -> None:
    """Every rank reads its own shard of each parameter straight from the safetensors files.

    FSDP2 shards dim 0 in ``torch.chunk`` pieces; rank r's piece of a tensor is read
    as a slice of the file (a memory map, opened per tensor so the pages read do
    not stay resident). No rank ever holds a full tensor, let alone a whole model.
    """
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            where.update({k: f for k in st.keys()})
    with torch.no_grad():
        for name, param in policy.named_parameters():
            key = name[len("lm."):]
            with safe_open(str(where[key]), framework="pt") as st:
                if isinstance(param, DTensor):
                    local = param.to_local()
                    rows = st.get_slice(key).get_shape()[0]
                    lo = min(rows, ctx.rank * -(-rows // ctx.world_size))  # torch.chunk: ceil-sized pieces
                    local.copy_(st.get_slice(key)[lo : lo + local.shape[0]].to(dtype))
                else:  # not sharded (FSDP2 shards every parameter; kept for safety)
                    param.copy_(st.get_tensor(key).to(dtype))


def warn_pure_bf16(lr: float) -> None:
    warnings.warn(
        f"dtype bfloat16-pure keeps the weights in bf16: an update smaller than ~1/256 of a weight is rounded "
        f"away (at lr {lr:g} most are) — use dtype bfloat16 (fp32 master weights) unless memory forbids it",
        stacklevel=2,
    )


def check_chunked_head(policy: PolicyLogprobs) -> None:
    """Fail loudly if the chunked head does not reproduce the model's own logits (an architecture
    with a head transform this module does not know). Runs on a 3-token input, single process only."""
    lm = policy.lm
    ids = torch.tensor([[0, 1, 2]], device=next(lm.parameters()).device) % max(2, int(lm.get_output_embeddings().weight.shape[0]))
    with torch.no_grad():
        ref = lm(input_ids=ids, use_cache=False).logits.float()
        hidden = lm.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        ours = policy.head_logits(hidden).float()
    if not torch.allclose(ref, ours, rtol=1e-3, atol=1e-3):
        raise UserError(
            f"{type(lm).__name__}: the chunked log-prob head does not reproduce the model's logits "
            f"(max difference {float((ref - ours).abs().max()):.3g}) — this architecture transforms its logits in a way "
            "toprcli does not know; please report it"
        )
