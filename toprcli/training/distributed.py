"""torchrun / FSDP2 helpers: process group, device, sharding, reductions.

``torchrun --nproc-per-node N -m toprcli train ...`` sets RANK, WORLD_SIZE,
LOCAL_RANK; :func:`init_distributed` joins the process group (NCCL on GPUs,
gloo on CPUs). :func:`shard_model` applies FSDP2 ``fully_shard`` to every
decoder layer and then to the root, with bf16 parameters and float32 gradient
reduction on GPUs. A single process (no torchrun) gets a context with
``world_size == 1`` and every helper here becomes a no-op, so the trainer has
one code path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from toprcli.errors import UserError


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    mesh: Optional[object] = None  # DeviceMesh when distributed
    owns_group: bool = False  # this module created the process group (and destroys it)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


DIE_WITH_PARENT = "TOPRCLI_DIE_WITH_PARENT"  # set for children of `topr iterate`: die with the launcher


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:  # pragma: no cover - no glibc
        pass


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_cuda_index() -> int:
    """This rank's GPU: its LOCAL_RANK among the visible ones (a launcher that shows each rank only its own GPU,
    CUDA_VISIBLE_DEVICES per task, leaves one: cuda:0). More ranks than GPUs would put two on one: refused."""
    rank, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if count > 1 and rank >= count:
        raise UserError(f"local rank {rank} of a machine that shows {count} GPUs — start at most {count} ranks per machine "
                        "(--nproc-per-node), or show each rank one GPU (CUDA_VISIBLE_DEVICES)")
    return rank % max(1, count)


def init_distributed() -> DistContext:
    """Join the torchrun process group if there is one; pick this rank's device."""
    ws = env_world_size()
    if ws > 1 and (os.environ.get(DIE_WITH_PARENT) or os.environ.get("TORCHELASTIC_RUN_ID")):
        # A worker of a torchrun agent (ours or the user's): if the agent is killed, a rank would otherwise
        # wait in a collective for the others forever, holding its memory and spinning on a core.
        die_with_parent()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_cuda_index()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if ws <= 1:
        return DistContext(device=device)
    owns = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=device if cuda else None, timeout=COLLECTIVE_TIMEOUT)
        owns = True
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(ws))),
        device=device,
        mesh=mesh,
        owns_group=owns,
    )


def shutdown(ctx: DistContext) -> None:
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: modules whose class is in the HF model's ``_no_split_modules``."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:  # not an HF model: fall back to the largest ModuleList
        lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        layers = list(max(lists, key=len)) if lists else []
    return layers


# How long a rank waits in a collective before the job is declared hung. Rank 0 alone writes the final policy (a
# large model's full fp32 save) while the others wait at a barrier: NCCL's 10-minute default would abort them.
COLLECTIVE_TIMEOUT = timedelta(hours=1)


def shard_model(model: torch.nn.Module, ctx: DistContext, *, bf16: bool) -> torch.nn.Module:
    """FSDP2: ``fully_shard`` each decoder layer, then the root (embeddings, norm, head).

    With ``bf16`` (GPU), parameters are all-gathered and computed in bfloat16
    while gradients are reduced and kept in float32 (the master weights stay
    float32). Gradients are summed over ranks, not averaged: the trainer
    already divides by the global normaliser (see ``batching.loss_denominator``).
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # Gradients are summed over ranks in float32 always (bfloat16-pure's would otherwise be summed in bf16).
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=ctx.mesh, mp_policy=mp)
    fully_shard(model, mesh=ctx.mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            _sum_gradients(m)
    return model


def _sum_gradients(m: torch.nn.Module) -> None:
    """Gradients summed over ranks, not averaged (FSDP2's default divides by the world size: the lr would shrink by it)."""
    if hasattr(m, "set_gradient_divide_factor"):  # torch >= 2.8
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM; NCCL gets zero-copy transfers)
    elif hasattr(m, "set_reduce_scatter_divide_factor"):  # torch 2.6-2.7: the same factor by its older name (not run here)
        m.set_reduce_scatter_divide_factor(1.0)
    else:
        raise RuntimeError(f"torch {torch.__version__}: FSDP2 has no way to sum gradients over ranks — install torch >= 2.8")


REDUCE_CHUNK = 1 << 26  # elements on the device at a time: a whole dataset's log-probs (4 B a token: 130 GB at 8M rows) would not fit


def all_reduce(t: torch.Tensor, ctx: DistContext, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max) of a contiguous tensor, :data:`REDUCE_CHUNK` elements at a time; identity for
    one process."""
    if ctx.distributed:
        flat = t.view(-1)
        for start in range(0, flat.numel(), REDUCE_CHUNK):
            part = flat[start : start + REDUCE_CHUNK]
            moved = part.to(ctx.device)
            dist.all_reduce(moved, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
            if moved is not part:
                part.copy_(moved.to(part.device))
    return t


def every_rank(flag: bool, ctx: DistContext) -> bool:
    """Whether ``flag`` holds on every rank (all ranks call it): a choice each rank makes from its own view of the
    files (a checkpoint, a saved pass, a model's shards; a stale NFS listing) is agreed before a collective depends on it,
    or one rank waits in a collective the others never reach."""
    missing = torch.tensor([0.0 if flag else 1.0])
    return not all_reduce(missing, ctx, op="max").item()


def union_keys(keys, ctx: DistContext) -> list[str]:
    """The sorted union of every rank's ``keys``, so that ranks which saw different metrics (a rank whose
    micro-batches are all padding has none of a loss's own, nor the first step's gap) reduce one vector."""
    if not ctx.distributed:
        return sorted(keys)
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, sorted(keys))
    return sorted(set().union(*gathered))


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def broadcast_object(obj, ctx: DistContext):
    """Rank 0's ``obj`` on every rank."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
