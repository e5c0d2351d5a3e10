"""`topr iterate`: generate → score → curate → train → eval, round after round, resumable
(docs/architecture.md §1: the steps, the run directory, the engine hand-over).

Reads a pipeline config (:class:`~toprcli.config.IterateConfig`). Writes a run
directory::

    RUN_DIR/config.yaml          the resolved config (updated when the run is extended or changed: runs.py)
    RUN_DIR/lineage.json         a branch's parent run and round (runs.py)
    RUN_DIR/state.json           steps done, with wall times (for people, and the trackers' wall times)
    RUN_DIR/base/                the built-in tiny model (warm_start.init_model)
    RUN_DIR/warmstart/gold.parquet, policy/   supervised warm start on gold solutions
    RUN_DIR/round-000/eval/      the starting policy, evaluated
    RUN_DIR/round-001/config.yaml   the resolved config this round ran with
    RUN_DIR/round-001/samples/ scored/ train.parquet policy/ eval/
    ...

Every step is idempotent: it is *done* when its output exists in complete form
(a stage's ``_manifest.json``, an atomically renamed policy dir, ``eval.json``),
and each stage resumes its own partial work (shards, training checkpoints). So
a run killed at any point and re-run with the same command continues from the
last complete step with nothing lost or duplicated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toprcli import run_paths, run_tracking, runs
from toprcli.config import EngineConfig, EvalConfig, IterateConfig, TrainConfig, validated
from toprcli.data.datasets import default_verifier, load_examples
from toprcli.errors import MadeOtherwise, UserError
from toprcli.generation import open_backend
from toprcli.generation.base import cuda_available
from toprcli.launch import run_eval, run_generate, run_train, runs_in_child
from toprcli.models.tiny import TINY_PRESETS, build_tiny_model
from toprcli.progress import ProgressFn
from toprcli.runs import VERIFIER_KEYS, round_dir, round_summary, run_summary
from toprcli.shards import check_writable, output_lock, read_manifest, write_json_atomic
from toprcli.stages import curate, score, warmstart
from toprcli.stages import train as train_stage
from toprcli.stages.checks import check_before_work, check_starting_model
from toprcli.verifiers import check_sources

STATE_FILE = "state.json"
# What a round reports of a generative verifier's judgement (eval's verifier_model or candidates).
# What a round's summary takes from its eval (a round's eval may come later than the rest: eval_every, a run extended).
EVAL_KEYS = ("pass@1", "maj@k", "pass@k", "k", "invalid_rate", "greedy_accuracy", "error_rate", "greedy_error_rate", "truncated_rate", "intervals", "bootstrap", *VERIFIER_KEYS)


@dataclass
class Step:
    """One unit of resumable work: done when ``is_done()``; ``run()`` resumes or starts it."""

    key: str  # e.g. "round-001/train"
    is_done: Callable[[], bool]
    run: Callable[[], Any]


class EngineHolder:
    """One generation backend for the whole run, pointed at whichever policy is needed.

    Opening a vLLM engine costs tens of seconds; swapping weights in place costs
    far less, so the engine that samples a round's training prompts also
    evaluates that round's trained policy and serves the next round. It is
    opened lazily (a resumed run past generation never starts one).

    Hand-over: :meth:`release` gives the engine's device memory back before
    training — vLLM's sleep mode where the engine supports it (GPUs: weights
    and KV cache discarded), else the engine is closed — and :meth:`get`
    takes it again (wake up, or reopen) with the new policy's weights. The
    seconds both cost are kept in ``handover_s`` for the run's state.
    """

    def __init__(self, engine: EngineConfig, seed: int, *, sleep_mode: bool = False):
        self.engine = engine
        self.seed = seed
        self.sleep_mode = sleep_mode
        self.backend: Any = None
        self.model: str | None = None
        self.asleep = False
        self.handover_s: dict[str, float] = {}

    def get(self, model: str, engine: EngineConfig | None = None) -> Any:
        """The backend serving ``model`` with the ``engine`` settings (default: the ones it has); other
        settings (a round recorded with them) close it, to reopen with theirs."""
        if engine is not None and engine != self.engine:
            self.close()
            self.engine, self.model = engine, None
        t0 = time.perf_counter()
        reacquire = self.asleep or (self.backend is None and self.model is not None)
        if self.backend is None:
            self.backend = open_backend(self.engine, model, seed=self.seed, sleep_mode=self.sleep_mode)
        elif self.asleep:
            self.backend.wake_up(model)  # with the weights of ``model``
            self.asleep = False
        if str(self.backend.model) != model:
            self.backend.load_weights(model)
        self.model = model
        if reacquire:
            self.handover_s["reacquire_s"] = round(time.perf_counter() - t0, 3)
        return self.backend

    def release(self) -> None:
        """Give the device memory back (sleep, or close); the next :meth:`get` takes it again."""
        if self.backend is None or self.asleep:
            return
        t0 = time.perf_counter()
        if getattr(self.backend, "can_sleep", False):
            self.backend.sleep()
            self.asleep = True
        else:
            self.backend.close()
            self.backend = None
        self.handover_s = {"release_s": round(time.perf_counter() - t0, 3)}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
            self.asleep = False


class State:
    """``state.json``: what finished when; for people and the trackers' wall times, never for deciding what to run."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / STATE_FILE
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {"steps": {}}
        except (OSError, ValueError):  # damaged from outside (topr writes it whole): bookkeeping must not stop a resume
            warnings.warn(f"{self.path} is unreadable: the times of earlier steps are lost, the run resumes from its files", stacklevel=2)
            self.data = {"steps": {}}

    def record(self, key: str, wall_time_s: float, **info: Any) -> None:
        self.data["steps"][key] = {"wall_time_s": round(wall_time_s, 3), "finished_at": time.time(), **info}
        write_json_atomic(self.path, self.data)


# -- the loop -----------------------------------------------------------------


class Pipeline:
    """A run of ``cfg``: :meth:`run` does every step not yet done in ``cfg.run_dir``.

    ``branch_from`` (``RUN/round-00K``) starts the run from another run's round K; ``apply_from_next_round``
    lets a changed config apply from the next round. ``on_start(lineage)`` is called once the run is
    checked (and branched: the lineage, else None), before any work; ``on_round(r, summary)`` after each
    round's eval; ``report(run_dir)`` writes the report at the end and returns its directory.
    """

    def __init__(self, cfg: IterateConfig, *, progress: ProgressFn | None = None, on_start: Callable[[dict | None], None] | None = None,
                 on_round: Callable[[int, dict], None] | None = None, apply_from_next_round: bool = False,
                 branch_from: str | None = None, report: Callable[[Path], Path] | None = None):
        self.cfg = cfg = validated(cfg)  # built in Python, it skipped a config file's checks
        self.branch_from, self.on_start = branch_from, on_start
        self.report, self.report_dir = report, None  # report: writes the run's report, returns its directory
        self.tracker: run_tracking.Tracker | None = None
        self.tracked: dict[str, str] = {}  # each tracker's run, in words (after run())
        self.changes: dict[str, str] = {}  # each setting changed since the run's record, and where it applies (after prepare())
        self.run_dir = Path(cfg.run_dir)
        self.progress = progress
        self.on_round = on_round
        self.apply_from_next_round = apply_from_next_round
        self._round_cfgs: dict[int, IterateConfig] = {}
        self.handover = _wants_handover(cfg)
        self.engine = EngineHolder(cfg.generate.engine, cfg.generate.sampling.seed, sleep_mode=self.handover)
        self.state: State | None = None

    # paths and policies ---------------------------------------------------

    def base_policy(self) -> str:
        """The policy of round 0: the warm-started model, else the configured model."""
        if self.cfg.warm_start.enabled:
            return str(self.run_dir / "warmstart" / "policy")
        return self.initial_model()

    def initial_model(self) -> str:
        if self.cfg.warm_start.init_model:
            return str(self.run_dir / "base")
        if not self.cfg.model:
            raise UserError("iterate needs a starting model — set `model:` in the config or warm_start.init_model: true")
        return self.cfg.model

    def policy_after(self, r: int) -> str:
        return self.base_policy() if r == 0 else str(round_dir(self.run_dir, r) / "policy")

    @functools.cached_property
    def _verifier(self) -> str:  # "auto" reads the dataset: once per run
        return default_verifier(self.cfg.generate.dataset) if self.cfg.score.verifier == "auto" else self.cfg.score.verifier

    def verifier(self) -> str:
        return self._verifier

    def round_cfg(self, r: int) -> IterateConfig:
        """The config round ``r`` runs with: what it recorded when it started (its resources today's), else the current one."""
        if r not in self._round_cfgs:
            self._round_cfgs[r] = runs.round_config(self.run_dir, r, current=self.cfg) or self.cfg
        return self._round_cfgs[r]

    # steps ----------------------------------------------------------------

    def steps(self) -> list[Step]:
        cfg, run = self.cfg, self.run_dir
        steps: list[Step] = []
        if cfg.warm_start.init_model:
            steps.append(Step("base/init-model", lambda: (run / "base" / "config.json").exists(), self._init_model))
        if cfg.warm_start.enabled:
            ws = run / "warmstart"
            steps.append(Step("warmstart/gold", lambda: (ws / "gold.parquet").exists(), lambda: warmstart.run(cfg, tokenizer=self.initial_model(), out=ws / "gold.parquet")))
            steps.append(Step("warmstart/train", lambda: train_stage.trained(ws / "policy"), self._warm_start_train))
        steps.append(self._eval_step(0))
        for r in range(1, cfg.rounds + 1):
            d = round_dir(run, r)
            steps += [
                Step(f"{d.name}/generate", lambda d=d: read_manifest(d / "samples") is not None, lambda r=r: self._generate(r)),
                Step(f"{d.name}/score", lambda d=d: read_manifest(d / "scored") is not None, lambda r=r: self._score(r)),
                Step(f"{d.name}/curate", lambda d=d: (d / "train.parquet").exists(), lambda r=r: self._curate(r)),
                Step(f"{d.name}/train", lambda d=d: train_stage.trained(d / "policy"), lambda r=r: self._train(r)),
            ]
            if r % self.round_cfg(r).eval_every == 0 or r == cfg.rounds:  # a round started under another eval_every keeps it
                steps.append(self._eval_step(r))
        return steps

    def _eval_step(self, r: int) -> Step:
        out = round_dir(self.run_dir, r) / "eval"
        return Step(f"round-{r:03d}/eval", lambda: (out / "eval.json").exists(), lambda: self._eval(r))

    def _init_model(self) -> None:
        target = self.run_dir / "base"
        if target.exists():  # a half-built dir (no config.json) from a killed run
            shutil.rmtree(target)
        build_tiny_model(target, seed=self.cfg.warm_start.model_seed, **TINY_PRESETS[self.cfg.warm_start.model_preset])

    def _warm_start_train(self) -> None:
        ws = self.run_dir / "warmstart"
        tcfg = replace(
            self.round_cfg(0).warm_start_train(),  # as recorded when the warm start began: a resume keeps its settings
            model=self.initial_model(), data=str(ws / "gold.parquet"), out=str(ws / "policy"), resume=True,
        )
        self._run_training(tcfg, self._train_sink(0))

    def _run_training(self, tcfg: TrainConfig, sink: Callable[[dict], None] | None = None) -> None:
        """Train in this process, or under torchrun / the configured launcher in a child process;
        the generation engine first gives its memory back when the run hands the device over.
        ``sink`` gets each step's metrics live (in this process; a child's are replayed after)."""
        if self.handover:
            self.engine.release()
        run_train(tcfg, progress=self.progress, on_record=sink)

    def _generate(self, r: int) -> None:
        gcfg = replace(self.round_cfg(r).generate, model=self.policy_after(r - 1), out=str(round_dir(self.run_dir, r) / "samples"), iteration=r)
        run_generate(gcfg, backend=self._engine_for(gcfg.model, gcfg.data_parallel_size, gcfg.engine), progress=self.progress)

    def _score(self, r: int) -> None:
        d = round_dir(self.run_dir, r)
        scfg = replace(self.round_cfg(r).score, samples=str(d / "samples"), out=str(d / "scored"), verifier=self.verifier())
        score.run(scfg, progress=self.progress)

    def _curate(self, r: int) -> None:
        d, rc = round_dir(self.run_dir, r), self.round_cfg(r)
        earlier = [round_dir(self.run_dir, q) / "scored" for q in range(r - 1, max(0, r - 1 - rc.replay_rounds), -1)]
        sources = [str(d / "scored")] + [str(p) for p in earlier]
        weights = [1.0] + [rc.replay_weight] * len(earlier)
        ccfg = replace(rc.curate, scored=sources, out=str(d / "train.parquet"), source_weights=weights if earlier else None)
        curate.run(ccfg, progress=self.progress)

    def _train(self, r: int) -> None:
        d = round_dir(self.run_dir, r)
        start = self.policy_after(r - 1) if self.round_cfg(r).train_from == "previous" else self.base_policy()
        tcfg = replace(self.round_cfg(r).train, model=start, data=str(d / "train.parquet"), out=str(d / "policy"), resume=True)
        self._run_training(tcfg, self._train_sink(r))

    def eval_config(self, r: int, policy: str) -> EvalConfig:
        """Round ``r``'s eval of ``policy``. ``verifier: auto`` on the rounds' own task judges as the rounds are
        scored (verifier, strict, verifier_by_source); on another dataset it is that dataset's (as `topr eval`)."""
        ecfg = replace(self.round_cfg(r).eval, model=policy, out=str(round_dir(self.run_dir, r) / "eval"), iteration=r)
        if ecfg.verifier == "auto" and ecfg.dataset.source == self.cfg.generate.dataset.source:
            sc = self.round_cfg(r).score
            ecfg = replace(ecfg, verifier=self.verifier(), strict=sc.strict, verifier_by_source=sc.verifier_by_source)
        return ecfg

    def _eval(self, r: int) -> None:
        policy = self.policy_after(r)
        ecfg = self.eval_config(r, policy)
        # The run's engine serves eval when eval's engine settings are the round's generate's; else the stage opens
        # its own, and the run's gives its memory back first (with engine_handover keep, two engines held the device);
        # with child engines none does, and the run's engine is closed first.
        shared = ecfg.engine == self.round_cfg(r).generate.engine
        if not shared and ecfg.data_parallel_size == 1:
            self.engine.release()
        backend = self._engine_for(policy, ecfg.data_parallel_size, ecfg.engine) if shared or ecfg.data_parallel_size > 1 else None
        run_eval(ecfg, backend=backend, progress=self.progress)

    def _engine_for(self, model: str, processes: int, engine: EngineConfig) -> Any:
        """The run's engine serving ``model`` with a round's ``engine`` settings; none when ``processes`` child
        engines generate instead (it is closed: this process's engine would hold memory for nothing)."""
        if processes > 1:
            self.engine.close()
            return None
        return self.engine.get(model, engine)

    # driving --------------------------------------------------------------

    def prepare(self) -> dict[str, Any] | None:
        """Before any work, each refusal one line: a tracker's package missing, a bad ``branch_from``, a changed
        config the run cannot take (runs.reconcile). Makes the branch (once) and records the config the run
        can take. Returns a branch's lineage (its parent run and round), else None."""
        check_before_work(self.cfg)  # a round must not fail on a typo after generating, with a run dir that then holds it
        first = not (self.run_dir / runs.CONFIG_FILE).exists() or runs.made_nothing(self.run_dir)  # a launch that failed before any work too
        if first and not self.cfg.warm_start.init_model and not (self.branch_from and self.cfg.train_from == "previous"):
            check_starting_model(self.cfg, self.initial_model())  # refused before the run dir records it (a branch: its round's policy)
        if first and self.verifier() == "data_source":  # an unmapped verl source: refused before round 0 generates
            check_sources({e.data_source for e in load_examples(self.cfg.generate.dataset)}, self.cfg.score.verifier_by_source)
        if self.cfg.score.verifier == "auto":  # recorded as what it stands for: a rerun resolves it the same, or is refused
            self.cfg = replace(self.cfg, score=replace(self.cfg.score, verifier=self.verifier()))
        parent = Path(self.branch_from).parent if self.branch_from else None  # RUN of RUN/round-00k: a new branch is held to its files
        paths = run_paths.check_paths(self.run_dir, self.cfg, pinned=not first, parent=parent)  # words that name other files than when it began
        lineage = runs.branch(self.branch_from, self.run_dir, self.cfg) if self.branch_from else None
        before = runs.round_records(self.run_dir)
        edited = run_paths.recorded_copy(self.run_dir)  # config.yaml edited by hand: checked against topr's copy, as a -c is
        try:
            if edited is not None:  # checked before it is pended as topr's own: a refused edit must not be taken next time
                runs.reconcile(self.run_dir, self.cfg, apply_from_next_round=self.apply_from_next_round, write=False, recorded_file=edited)
            with run_paths.recording(self.run_dir, self.cfg):
                changed = runs.reconcile(self.run_dir, self.cfg, apply_from_next_round=self.apply_from_next_round, recorded_file=edited)
        except UserError as e:
            if edited is None:
                raise
            raise UserError(f"{e} ({self.run_dir / runs.CONFIG_FILE} was edited since topr recorded it; the record: {edited})") from None
        run_paths.record_paths(self.run_dir, paths)
        run_paths.keep_recorded_copy(self.run_dir, self.cfg, edited)
        self.changes = runs.where_changes_apply(self.run_dir, changed, before)
        return lineage

    def run(self) -> list[dict[str, Any]]:
        check_writable(self.run_dir)
        with output_lock(self.run_dir):  # one `topr iterate` per run dir
            lineage = self.prepare()
            if self.on_start is not None:
                self.on_start(lineage)
            return self._run()

    def _run(self) -> list[dict[str, Any]]:
        self.state = State(self.run_dir)
        self.tracker = run_tracking.open_run_tracker(self.cfg, self.run_dir)
        try:
            with self.tracker or contextlib.nullcontext():
                steps = self.steps()
                for step in steps:
                    if not step.is_done():
                        self._track(step.key, partial=True)  # a killed training's steps, before it resumes
                        self._run_step(step)
                    self._track(step.key)  # also what finished before a resume, or before tracking was on
                    self._prune(steps)
                if self.report is not None:
                    self.report_dir = self.report(self.run_dir)
                    if self.tracker is not None:
                        self.tracker.log_artifacts(self.report_dir, "report")
                self.tracked = self.tracker.where() if self.tracker is not None else {}
        finally:
            self.engine.close()
        return run_summary(self.run_dir)

    def _run_step(self, step: Step) -> None:
        t0 = time.perf_counter()
        self.engine.handover_s = {}
        r = round_of(step.key)
        if step.key.startswith(("round-", "warmstart/")):  # a round's config is recorded when it starts (the warm start's is round 0's)
            runs.record_round(self.run_dir, r, self.round_cfg(r))
        try:
            step.run()
        except MadeOtherwise as e:  # the stage's fix (--out, --resume) is for a command run alone; here the run owns the output
            raise UserError(f"{str(e).split(' — ')[0]} — {step.key} cannot resume it: remove {e.where} to redo the step (a run dir copied "
                            "with `cp -r` gets new file times, which toprcli's fingerprints read: `cp -a` and `rsync -a` keep them)") from None
        if not step.is_done():  # a stage that returned without its output would be skipped on, and fail the next step
            raise UserError(f"{step.key} ended without its output — rerun the same command to resume it")
        self.state.record(step.key, time.perf_counter() - t0, **self.engine.handover_s)
        if step.key.endswith("/eval") and self.on_round is not None:
            self.on_round(r, round_summary(self.run_dir, r))

    def _prune(self, steps: list[Step]) -> None:
        """``keep_policies``: the weights of the rounds before the last N trained go once no step left needs them (an
        eval to come keeps its round's; the next round starts from the last, always kept)."""
        if self.cfg.keep_policies is None:
            return
        pending = {round_of(s.key) for s in steps if s.key.endswith("/eval") and not s.is_done()}
        for r in range(1, runs.trained_rounds(self.run_dir) - self.cfg.keep_policies + 1):
            if r not in pending and train_stage.trained(round_dir(self.run_dir, r) / "policy") and not runs.pruned(self.run_dir, r):
                runs.prune_policy(self.run_dir, r)

    # tracking ---------------------------------------------------------------

    def _train_sink(self, r: int) -> Callable[[dict], None] | None:
        """Round ``r``'s step metrics (0: the warm start) for the trackers."""
        if self.tracker is None:
            return None
        if r == 0:
            return run_tracking.step_sink(self.tracker, "warmstart")
        return run_tracking.step_sink(self.tracker, "train", run_tracking.train_offset(self.run_dir, r), round=r)

    def _track(self, key: str, *, partial: bool = False) -> None:
        """Report a finished step: a training's steps, a round once its last step is done (``partial``: the steps
        a killed training logged to its ``policy.partial/metrics.jsonl``, which a backend may have lost)."""
        if self.tracker is None:
            return
        where, stage = key.split("/")
        r = round_of(key)
        if stage == "train":
            policy = self.run_dir / where / ("policy.partial" if partial else "policy")
            run_tracking.log_training(self.tracker, policy, self._train_sink(r))
        if partial:
            return
        last = "eval" if r == 0 or r % self.round_cfg(r).eval_every == 0 or r == self.cfg.rounds else "train"  # as steps() decides
        if where.startswith("round-") and stage == last:
            times = run_tracking.wall_times(self.state.data["steps"], r)
            run_tracking.log_round(self.tracker, self.run_dir, r, round_summary(self.run_dir, r), times, EVAL_KEYS)


def round_of(key: str) -> int:
    """The round a step belongs to: k of ``round-00k/...``; 0 for the steps before round 0 (base, warm start)."""
    where = key.split("/")[0]
    return int(where.split("-")[1]) if where.startswith("round-") else 0


def _wants_handover(cfg: IterateConfig) -> bool:
    """Whether the engine gives its device memory back before training (see EngineHolder)."""
    if cfg.engine_handover != "auto":
        return cfg.engine_handover == "release"
    return cuda_available() or runs_in_child(cfg.train) or runs_in_child(cfg.warm_start_train())
