"""The train stage: a policy + a curated training set → a new policy.

Reads: a policy (HF model dir or hub id) and a curated training set (a Parquet
file or shard dir with ``CURATED_SCHEMA`` columns: token ids, ``behavior_logprobs``
= log μ, ``advantage``, ``weight``; and its ``sampling`` metadata, the
distribution μ was drawn from).

Writes ``<out>/``: the new policy in HF format (safetensors + tokenizer,
loadable by transformers and vLLM; LoRA merged; float32 weights unless
``save_dtype`` says otherwise), ``metrics.jsonl`` (one line per optimizer
step), ``train_summary.json``, ``_manifest.json`` and, with ``--report-to``,
the trackers' ``tracking.json`` (and ``tb/``, ``wandb/``). While running, everything lives in ``<out>.partial/``
(with ``checkpoints/`` and, when μ or a reference is recomputed,
``precomputed.npz``); the directory is renamed to ``<out>`` only when the
policy is complete, so ``<out>`` never holds a partial policy.

Re-running:
* ``<out>`` complete: with the same settings and data, nothing to do (the saved
  summary is returned); with others, an error unless ``overwrite`` (train again,
  replace it at the end).
* ``<out>.partial`` left by a killed run: ``resume`` continues from its latest
  checkpoint (same config and data required) and ends with the same weights as
  an uninterrupted run (on CPU, measured; on a GPU up to the non-deterministic kernels of a
  backward pass, atomics in attention and index_select, not run here); without ``resume`` it
  is discarded and training starts over.
* SIGTERM or SIGINT (when the CLI installed :mod:`toprcli.interrupt`): every rank
  stops at the same step boundary, saves a checkpoint there and raises
  :class:`~toprcli.interrupt.Interrupted`; ``resume`` continues from that step.

Under ``torchrun`` every rank calls :func:`run`: rank 0 holds the output lock
and writes the run's files, every rank trains its shard (FSDP2). The loop
itself is :func:`toprcli.training.trainer.train_loop`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from toprcli import interrupt, shards
from toprcli.config import TrainConfig, as_now, config_to_dict, validated
from toprcli.errors import UserError
from toprcli.generation.base import release_cuda_cache
from toprcli.progress import ProgressFn
from toprcli.stages import StageResult
from toprcli.tracking import TRACKER_FILES, behind, check_installed, open_tracker, replay
from toprcli.training import node_data
from toprcli.training.distributed import barrier, env_rank, env_world_size, init_distributed, shutdown
from toprcli.training.prepare import NON_SEMANTIC_KEYS, SUMMARY_NAME, Prepared, prepare, resolve_loss
from toprcli.training.trainer import METRICS_NAME, PRECOMPUTED_NAME, seeded_rng, train_loop

STAGE = "train"


def run(cfg: TrainConfig, *, progress: ProgressFn | None = None, on_record: Callable[[dict[str, Any]], None] | None = None) -> StageResult:
    """Train ``cfg.model`` on ``cfg.data`` with loss ``cfg.loss``; write the policy to ``cfg.out``.

    Works as one process or under ``torchrun`` (FSDP2; every rank calls this).
    The result's summary is ``<out>/train_summary.json``. Raises
    :class:`~toprcli.errors.UserError` for bad input before any output directory exists.
    ``on_record`` gets each step's metrics (a pipeline's trackers); without it, rank 0
    reports to ``cfg.tracking``'s own.
    """
    cfg = validated(cfg)
    if (cfg.nproc_per_node > 1 or cfg.launcher) and env_world_size() == 1:  # it trained in one process, in silence
        raise UserError(f"train: {'--launcher' if cfg.launcher else f'--nproc-per-node {cfg.nproc_per_node}'} starts the ranks in "
                        "child processes — call toprcli.launch.run_train(cfg), as `topr train` does")
    done = finished_summary(cfg)
    if done is not None:  # a finished run: nothing to do but what a kill in _finish left, and its trackers' gaps
        return kept(cfg, done, on_record)
    check_installed(cfg.tracking.report_to)
    prep = prepare(cfg)
    shared = node_data.directory(prep.out, prep.data_fingerprint)  # under torchrun: the set this machine's ranks map
    # One writer per output: rank 0 holds the lock for the whole run (its peers write only their shards).
    lock = shards.output_lock(prep.out) if env_rank() == 0 else contextlib.nullcontext()
    with node_data.removed_after(shared), lock:
        threads_before = torch.get_num_threads()
        ctx = init_distributed()
        barrier(ctx)  # every rank has mapped the shared set: its files can go now
        node_data.remove(shared)
        try:
            if cfg.threads:
                torch.set_num_threads(cfg.threads)
            elif ctx.distributed and ctx.device.type == "cpu":
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.local_world_size))
            # A SIGTERM/SIGINT stops at the next step boundary with a checkpoint (interrupt.deferred).
            with interrupt.deferred(), seeded_rng(cfg.seed):
                with _tracked(prep, on_record) as sink:  # closed before <out>.partial becomes <out>
                    summary = train_loop(prep, ctx, progress if ctx.is_main else None, sink)
                if ctx.is_main:
                    _finish(prep, summary)
                barrier(ctx)
        finally:
            torch.set_num_threads(threads_before)
            shutdown(ctx)
            gc.collect()  # the model, its gradients and optimizer state are garbage now:
            release_cuda_cache()  # a vLLM engine waking next in this process's pipeline needs that memory
    return StageResult(STAGE, str(prep.out), summary, wall_time_s=summary["wall_time_s"])


def finished_summary(cfg: TrainConfig) -> dict[str, Any] | None:
    """Without ``overwrite``: the summary of a complete ``<out>`` trained with these settings and data (the same command
    run again does nothing, as every stage), else None; one trained otherwise is refused (it was kept and reported as
    trained). How it ran (memory, threads, ranks) and where its model and data lay (a run dir that moved) are no difference."""
    out = Path(cfg.out) if cfg.out else None
    if out is None or cfg.overwrite or not ((out / SUMMARY_NAME).is_file() and (out / "config.json").is_file()):
        return None
    record = shards.read_manifest(out) or {}
    ignored = {*NON_SEMANTIC_KEYS, "model", "ref_model", "data"} - {"save_dtype"}
    changed = sorted(k for k in shards.changed_keys(as_now(TrainConfig, record.get("config") or {}), config_to_dict(cfg)) if k.split(".")[0] not in ignored)
    inputs = record.get("inputs", {})
    if inputs.get("data_fingerprint") not in (None, shards.fingerprint(cfg.data)):
        changed.append("data (its files)")
    for key in ("model", "ref_model"):  # by their files: another model (or one retrained in place) is another training
        if inputs.get(f"{key}_files") not in (None, shards.model_identity(getattr(cfg, key) or "")):
            changed.append(f"{key} (its files)")
    if record.get("config") and changed:
        raise UserError(f"{out} is a finished training with other settings (changed: {', '.join(changed[:4])}) — pass --overwrite "
                        "to train it again, or choose another --out")
    return shards.read_json(out / SUMMARY_NAME)


def kept(cfg: TrainConfig, done: dict[str, Any], on_record: Callable[[dict[str, Any]], None] | None = None) -> StageResult:
    """A finished ``<out>`` (:func:`finished_summary`) kept as it is: what a kill right after its rename left is tidied,
    and its own trackers get the steps they lack (a backend that failed mid-run, or one named since)."""
    out, metrics = Path(cfg.out), Path(cfg.out) / METRICS_NAME
    drop_training_state(out)
    if on_record is not None or env_rank() != 0 or not cfg.tracking.report_to:  # no trackers of its own: metrics.jsonl unread
        return StageResult(STAGE, str(out), done, skipped=True, wall_time_s=done.get("wall_time_s", 0.0))
    last = max((r["step"] for r in shards.read_jsonl_records(metrics) if "step" in r), default=0) if metrics.is_file() else 0
    if behind(out, cfg.tracking, "train", last):
        check_installed(cfg.tracking.report_to)
        with open_tracker(cfg.tracking, out, config=config_to_dict(cfg), name=out.name) as tracker:
            replay(metrics, lambda record: tracker.log("train", record, record["step"]))
    return StageResult(STAGE, str(out), done, skipped=True, wall_time_s=done.get("wall_time_s", 0.0))


def check_loss(cfg: TrainConfig) -> None:
    """The loss, its options and the KL settings, checked on a tiny batch (a pipeline, before any round)."""
    resolve_loss(cfg)


def check(cfg: TrainConfig) -> None:
    """What :func:`run` would refuse, refused without training: a launcher checks before its ranks start."""
    if finished_summary(cfg) is None:
        check_installed(cfg.tracking.report_to)
        prepare(cfg)


@contextlib.contextmanager
def _tracked(prep: Prepared, on_record: Callable[[dict[str, Any]], None] | None) -> Iterator[Callable[[dict[str, Any]], None] | None]:
    """Where step records go: the caller's sink, else this run's own trackers (rank 0; files in ``<out>.partial``)."""
    if on_record is not None or env_rank() != 0 or not prep.cfg.tracking.report_to:
        yield on_record
        return
    if not prep.cfg.resume:  # training starts over: so does its tracked run
        for entry in (prep.partial / name for name in TRACKER_FILES):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
    tracker = open_tracker(prep.cfg.tracking, prep.partial, config=config_to_dict(prep.cfg), name=Path(prep.cfg.out).name,
                           final_root=prep.out)
    with tracker:
        sink = lambda record: tracker.log("train", record, record["step"])  # noqa: E731
        if prep.cfg.resume:
            replay(prep.partial / METRICS_NAME, sink)  # a killed run's steps, which a backend may have lost
        yield sink


class SkippedSteps(UserWarning):
    """Optimizer steps skipped because their gradient was not finite: the policy lacks their updates."""


def warn_skipped_steps(result: StageResult) -> None:
    """A run that skipped steps (NaN or inf gradients) says so: its policy saved as trained lacks those updates."""
    n, steps = result.summary.get("skipped_steps") or 0, result.summary.get("steps") or 0
    if n and not result.skipped:
        warnings.warn(SkippedSteps(f"{n} of {steps} optimizer steps were skipped: their gradient was not finite (NaN or inf: a learning "
                                   f"rate too high, or a bf16 overflow), so {result.out} lacks their updates — lower --lr or train in float32"))


def _finish(prep: Prepared, summary: dict) -> None:
    """Record the run in <out>.partial, rename it to <out>, then drop the training state.

    In that order: killed before the rename, the run resumes from its last checkpoint; after
    it, <out> is complete and a resume removes what is left of the training state. (Deleting
    first could leave a half-deleted checkpoint for --resume to load, or none: training anew.)"""
    partial = prep.partial
    shards.write_json_atomic(partial / SUMMARY_NAME, shards.json_safe(summary))
    shards.write_manifest(
        partial,
        stage=STAGE,
        config=config_to_dict(prep.cfg),
        inputs={"model": prep.cfg.model, "data": prep.cfg.data, "data_fingerprint": prep.data_fingerprint,
                "model_files": shards.model_identity(prep.cfg.model), "ref_model_files": shards.model_identity(prep.cfg.ref_model or "")},
        counts={"rows": summary["rows"], "steps": summary["steps"], "tokens": summary["tokens"]},
        wall_time_s=summary["wall_time_s"],
        sampling=summary["sampling"],
        reference_logprobs=summary.get("reference_logprobs"),
    )
    shards.swap_dir_into_place(partial, prep.out)
    drop_training_state(prep.out)


def drop_training_state(out: Path) -> None:
    """Remove a finished run's checkpoints, precomputed log-probs and a killed run's lock file (safe to repeat)."""
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    (out / PRECOMPUTED_NAME).unlink(missing_ok=True)
    shards.remove_stale_lock(out)


def trained(out: Path) -> bool:
    """Whether ``out`` is a finished policy; what a kill between its rename and the cleanup left there goes (a
    pipeline never runs a finished step again: checkpoints of several times the model's size stayed for good)."""
    if not (out / "config.json").exists():
        return False
    drop_training_state(out)
    return True
