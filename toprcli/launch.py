"""How a stage runs: in this process, or in child processes — training under torchrun (or a
user's launcher), data-parallel generation (also eval's).

:func:`run_generate`, :func:`run_eval` and :func:`run_train` decide it from the config, for the
stage commands and ``topr iterate`` alike. Each child gets the stage's resolved
config as a YAML file next to its output and writes everything it prints to a
log file there; a failing child becomes one :class:`UserError` line naming its
exit code, its last error line and the log. Children die with their parent
(``PR_SET_PDEATHSIG`` on Linux), so a killed ``topr iterate`` leaves no training
running behind it; the rerun resumes from the stage's own checkpoints or shards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toprcli import interrupt
from toprcli.config import EvalConfig, GenerateConfig, TrainConfig, config_yaml
from toprcli.errors import RESUME_REFUSED, MadeOtherwise, UserError
from toprcli.generation.vllm_cpu import BIND_VAR, core_groups
from toprcli.progress import ProgressFn
from toprcli.shards import read_manifest, write_text_atomic
from toprcli.stages import StageResult
from toprcli.stages import eval as eval_stage
from toprcli.stages import generate as generate_stage
from toprcli.stages import train as train_stage
from toprcli.training.distributed import DIE_WITH_PARENT, die_with_parent, env_world_size


def run_generate(cfg: GenerateConfig, *, backend: Any = None, progress: ProgressFn | None = None) -> StageResult:
    """Generate in this process (on ``backend`` if given), or in ``data_parallel_size`` child processes."""
    if cfg.data_parallel_size > 1:
        return generate_data_parallel(cfg, progress)
    return generate_stage.run(cfg, backend=backend, progress=progress)


def run_eval(cfg: EvalConfig, *, backend: Any = None, progress: ProgressFn | None = None) -> StageResult:
    """Evaluate in this process; with ``data_parallel_size`` > 1 its generation passes run in child
    processes first (one engine each), and the stage then finds every pass generated."""
    if cfg.data_parallel_size > 1:
        eval_stage.check(cfg)  # its refusals come before the passes are generated
        for gcfg in eval_stage.generation_passes(cfg):
            generate_data_parallel(dataclasses.replace(gcfg, data_parallel_size=cfg.data_parallel_size), progress)
    return eval_stage.run(cfg, backend=backend, progress=progress)


def run_train(cfg: TrainConfig, *, progress: ProgressFn | None = None, on_record: Callable[[dict[str, Any]], None] | None = None,
              on_launch: Callable[[Path], None] | None = None) -> StageResult:
    """Train in this process (a torchrun rank included), or launch the ranks in a child (:func:`runs_in_child`;
    ``on_launch(log)`` is called once the input is checked, as the ranks start)."""
    if runs_in_child(cfg):
        done = train_stage.finished_summary(cfg)  # kept as it is: no ranks start (and its warnings are not said again)
        if done is not None:
            result = train_stage.kept(cfg, done, on_record)
        else:
            summary = train_in_child(cfg, on_launch)
            result = StageResult(train_stage.STAGE, cfg.out, summary, wall_time_s=summary.get("wall_time_s", 0.0))
    else:
        result = train_stage.run(cfg, progress=progress, on_record=on_record)
    train_stage.warn_skipped_steps(result)
    return result


def write_stage_config(cfg: Any, path: Path) -> Path:
    """The stage's resolved config as a single-stage YAML file (what the child reads with --config)."""
    return write_text_atomic(path, config_yaml(cfg))


def _last_error_line(log: Path, start: int = 0, limit: int | None = 300) -> str:
    """The line of ``log`` (from byte ``start``: this attempt's, the log is appended to) that says why a child failed, cut
    to ``limit`` characters."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    # topr's own one-line error first (a rank's), before torchrun's summary lines that mention "error"
    for wanted in (lambda ln: ln.startswith("error:"), lambda ln: "Error" in ln or "error" in ln):
        for ln in reversed(lines):
            if wanted(ln):
                return ln[:limit]
    return lines[-1][:limit] if lines else ""


STOP_GRACE_S = 120.0  # a stopped child's time to finish its step and checkpoint before it is killed


def run_logged(cmd: str | Sequence[str], log: Path, *, what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` (a shell line, or an argv list) with its output appended to ``log``; UserError if it fails.

    The child gets a session of its own: a Ctrl-C at the terminal reaches this process only, which
    passes a stop on once (:func:`_stop_child`). In the terminal's process group torchrun got it twice (the terminal's and
    ours), and on a second signal it sends its ranks SIGTERM after the SIGINT: "stop at once", no
    checkpoint. torchrun waits as long as we do before it kills its ranks (its default is 30 s).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(STOP_GRACE_S) - 10), **os.environ, **(env or {}), DIE_WITH_PARENT: "1"}
    with open(log, "ab") as out:
        start = out.tell()  # an earlier attempt's error line must not be taken for this one's
        out.write(f"$ {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd, shell=isinstance(cmd, str), stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
            preexec_fn=die_with_parent, executable="/bin/bash" if isinstance(cmd, str) else None,
        )
        try:
            code = proc.wait()
        except interrupt.Interrupted:
            _stop_child(proc)
            raise
        except BaseException:
            proc.kill()
            raise
    if code != 0:
        last = _last_error_line(log, start, limit=None)  # whole: a caller reads the refusal it ends with (RESUME_REFUSED)
        raise UserError(f"{what} failed (exit code {code}): {last} — see {log}")


def _stop_child(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Pass a stop request on as SIGTERM, whatever stopped us (training ranks checkpoint at their next step),
    then wait for the child; a second signal, or ``grace_s`` without an exit, kills it. SIGTERM because every
    launcher passes it on as a stop: srun reads one SIGINT as a request for its status and keeps running."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except BaseException:
        proc.kill()
        proc.wait()


# -- training ---------------------------------------------------------------------------


def training_command(cfg: TrainConfig, config_file: Path) -> str:
    """The shell line that trains ``config_file``: the user's launcher template, or torchrun on this node.

    A launcher template may use ``{config}`` (the train config file), ``{nproc_per_node}``
    and ``{python}``; e.g. ``srun torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d
    --rdzv-endpoint $HEAD:29500 -m toprcli train --config {config}``.
    """
    fields = {"config": shlex.quote(str(config_file)), "nproc_per_node": cfg.nproc_per_node, "python": shlex.quote(sys.executable)}
    if cfg.launcher:
        try:
            return cfg.launcher.format(**fields)
        except (KeyError, IndexError, ValueError) as e:
            raise UserError(f"train.launcher: bad template ({e}) — use the placeholders {{config}}, {{nproc_per_node}}, {{python}}") from None
    return (
        f"{fields['python']} -m torch.distributed.run --standalone --nproc-per-node {cfg.nproc_per_node} "
        f"-m toprcli train --config {fields['config']} --no-progress"
    )


def runs_in_child(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` asks for ranks this process must launch (not when it is a rank already)."""
    return (cfg.nproc_per_node > 1 or bool(cfg.launcher)) and env_world_size() == 1


def train_in_child(cfg: TrainConfig, on_launch: Callable[[Path], None] | None = None) -> dict[str, Any]:
    """Train ``cfg`` under torchrun (or ``cfg.launcher``) and return its ``train_summary.json``.

    The config and the log go next to the output: ``<out>.train.yaml``, ``<out>.train.log``.
    """
    out = Path(cfg.out)
    done = out / "train_summary.json"
    train_stage.check(_single_process_view(cfg))  # bad input is one line here, before N ranks start (and write a config and log)
    config_file = out.with_name(out.name + ".train.yaml")
    command = training_command(cfg, config_file)  # a bad launcher template: refused before the config is written
    write_stage_config(_single_process_view(cfg), config_file)
    log = out.with_name(out.name + ".train.log")
    if on_launch is not None:
        on_launch(log)
    try:
        run_logged(command, log, what=f"training of {out}")
    except UserError as e:  # the ranks refused their checkpoint (made otherwise): the caller's fix applies (iterate: remove it)
        if RESUME_REFUSED in str(e):
            raise MadeOtherwise(str(e), out.with_name(out.name + ".partial")) from None
        raise
    if not done.is_file():
        raise UserError(f"the training launcher exited without writing {done} — check train.launcher runs `toprcli train --config {config_file}`")
    return json.loads(done.read_text())


def _single_process_view(cfg: TrainConfig) -> TrainConfig:
    """What each rank reads: the same config without the launch settings (it must not launch again)."""
    return dataclasses.replace(cfg, nproc_per_node=1, launcher=None)


# -- data-parallel generation ------------------------------------------------------------


def device_groups(processes: int, per_process: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each process (consecutive groups of ``per_process`` of the GPUs this process sees:
    of its own CUDA_VISIBLE_DEVICES when set, a job's GPUs on a shared node); None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return [None] * processes
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = visible[: torch.cuda.device_count()] if visible else [str(d) for d in range(torch.cuda.device_count())]
    need = processes * per_process
    if need > len(devices):
        raise UserError(f"data_parallel_size {processes} × tensor_parallel_size {per_process} needs {need} GPUs, {len(devices)} are visible — lower them")
    return [",".join(devices[i * per_process : (i + 1) * per_process]) for i in range(processes)]


def generate_data_parallel(cfg: GenerateConfig, progress: ProgressFn | None = None) -> StageResult:
    """``cfg.data_parallel_size`` processes, one engine each, disjoint shard ranges into ``cfg.out``.

    Rows do not depend on the split: every prompt samples from its own seed. Each process logs
    to ``<out>/_logs/part-<i>.log``; ``progress`` counts the processes done. The result's counts
    are the merged manifest's.
    """
    if not cfg.out:
        raise UserError("no output directory — pass --out DIR")
    if cfg.num_shards > 1:  # the children split the prompts num-shards ways themselves: the two splits would overlap
        raise UserError(f"--data-parallel-size {cfg.data_parallel_size} with --num-shards {cfg.num_shards}: choose one split — "
                        "--data-parallel-size for the engines of one machine, --num-shards/--shard-index for one process per machine")
    out = Path(cfg.out)
    n = cfg.data_parallel_size
    one = dataclasses.replace(cfg, data_parallel_size=1, num_shards=n)
    config_file = write_stage_config(one, out.with_name(out.name + ".generate.yaml"))
    devices = device_groups(n, cfg.engine.tensor_parallel_size)
    cores = core_groups(n) if devices[0] is None else [None] * n
    procs, starts = [], {}
    for i, dev in enumerate(devices):
        env = {**os.environ, DIE_WITH_PARENT: "1"}
        if dev is not None:
            env["CUDA_VISIBLE_DEVICES"] = dev
        if cores[i] is not None:  # CPU engines: disjoint cores, not every engine on every core
            env[BIND_VAR] = cores[i]
        log = out / "_logs" / f"part-{i}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "toprcli", "generate", "--config", str(config_file), "--shard-index", str(i), "--json"]
        fh = open(log, "ab")
        starts[i] = fh.tell()  # the log is appended to: this attempt's lines begin here
        procs.append((i, subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent), fh, log))
    failed = []
    task = f"generate: {n} processes, logs in {out / '_logs'}"
    try:
        for i, proc, fh, log in procs:
            if progress is not None:
                progress(task, i, n)
            code = proc.wait()
            fh.close()
            if code != 0:
                failed.append((i, code, log))
        if progress is not None:
            progress(task, n, n)
    except BaseException:
        for _, proc, fh, _ in procs:
            proc.kill()
            fh.close()
        raise
    if failed:
        i, code, log = failed[0]
        said = _last_error_line(log, starts[i], limit=None)  # whole: the advice ends a message that names paths and settings
        if generate_stage.START_OVER in said:  # shards made otherwise: the caller's fix applies (iterate: remove them)
            raise MadeOtherwise(said.removeprefix("error: "), out)
        raise UserError(f"generation process {i} of {n} failed (exit code {code}): {said[:300]} — see {log}")
    manifest = read_manifest(out)
    # Each child's part manifest holds what it did in this invocation: a resumed run wrote only the missing shards.
    parts = [json.loads((out / f"_manifest.part-{i:03d}-of-{n:03d}.json").read_text())["summary"] for i in range(n)]
    summary = {**manifest["counts"], "backend": manifest["config"]["engine"]["backend_resolved"],
               "shards_written": sum(p["shards_written"] for p in parts), "shards_skipped": sum(p["shards_skipped"] for p in parts)}
    return StageResult(generate_stage.STAGE, cfg.out, summary, wall_time_s=manifest["wall_time_s"])
