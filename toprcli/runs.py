"""Runs that grow: extend a run, change a setting from the next round on, branch from a round.

A run directory records the config it was started with (``config.yaml``, updated when the run
is extended or changed) and each round the resolved config it ran with
(``round-00k/config.yaml``, written when the round starts and never changed after), so
``topr report`` and the round's own files say what changed when. A branch records where it
came from in ``lineage.json``.

* Raising ``rounds`` continues a run; lowering it below a round already begun is refused.
* Any other change needs ``--apply-from-next-round`` (never a prompt: runs have no terminal
  under CI or Slurm); rounds already started keep their recorded config, except that the round in
  progress takes the change for the steps it has not begun (a setting that fails a later step of
  it can be fixed without losing the steps it finished). Settings that would
  make the completed rounds inconsistent — the model, the training data, the verifier — stay
  refused; a changed eval setting is allowed and flagged by ``report``.
* ``--branch-from RUN/round-00k`` starts a new run directory holding rounds 0..k of RUN as hard
  links (symbolic links where the two are on different filesystems), so nothing large is copied;
  the new config applies from round k+1 on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

from toprcli.config import ConfigError, IterateConfig, config_to_dict, config_yaml, from_dict, read_yaml
from toprcli.errors import UserError
from toprcli.generation.model_info import PRUNED_FILE
from toprcli.losses import LOSSES
from toprcli.shards import changed_keys, value_at, read_file_metadata, read_json, write_json_atomic, write_text_atomic
from toprcli.stages import eval as eval_stage

CONFIG_FILE = "config.yaml"
LINEAGE_FILE = "lineage.json"
BEFORE_ROUNDS = ("base", "warmstart")  # what a run makes before its rounds: the built model, the warm start
# Keys whose change would make completed rounds inconsistent with the ones to come, and why.
FROZEN = {"model": "the model", "warm_start": "the starting policy", "generate.dataset": "the training data",
          "score.verifier": "the verifier", "score.strict": "the verifier", "score.verifier_by_source": "the verifier",
          "score.reward_correct": "the rewards", "score.reward_incorrect": "the rewards", "score.reward_no_answer": "the rewards"}
EVAL_KEYS = "eval."
VERIFIER_KEYS = ("best_of_k_verifier", "weighted_maj@k", "candidates_maj@k", "verifier_accuracy", "verifier_invalid_rate", "verifier_auc")
# The sampling distribution: a training set holds one, so rounds that replay earlier ones must keep it.
SAMPLING_KEYS = tuple(f"generate.sampling.{k}" for k in ("temperature", "top_p", "top_k", "min_p"))  # changes allowed, but they break comparability across rounds (report says so)


# How a step runs on this machine, not what it makes (each stage's own resume ignores them): a change applies at
# once, to a round already started too, so a round that ran out of memory is rerun with less.
TRAIN_RESOURCES = ("micro_batch_tokens", "gradient_checkpointing", "logprob_chunk_size", "threads", "nproc_per_node", "launcher", "save_every", "save_every_minutes")
RESOURCE_KEYS = ("engine_handover", "keep_policies", "generate.data_parallel_size", "score.workers", "eval.workers", "eval.data_parallel_size",
                 *(f"{stage}.engine.{k}" for stage in ("generate", "eval") for k in ("gpu_memory_utilization", "enforce_eager", "tensor_parallel_size", "batch_size")),
                 *(f"train.{k}" for k in TRAIN_RESOURCES))
WARM_START_RESOURCES = tuple(f"warm_start.train.{k}" for k in TRAIN_RESOURCES)  # the warm start's own, where its config sets them


def round_dir(run_dir: Path, r: int) -> Path:
    return Path(run_dir) / f"round-{r:03d}"


_ROUND_NAME = re.compile(r"round-(\d{3,})")


def round_dirs(run_dir: Path) -> dict[int, Path]:
    """Round number → directory, in order; anything else named round-* (a user's round-001.bak) is not a round."""
    found = {int(m.group(1)): p for p in Path(run_dir).glob("round-*") if p.is_dir() and (m := _ROUND_NAME.fullmatch(p.name))}
    return dict(sorted(found.items()))


def trained_rounds(run_dir: Path) -> int:
    """How many rounds finished training (the last round with a complete policy)."""
    return max((r for r, d in round_dirs(run_dir).items() if (d / "policy" / "config.json").exists()), default=0)


def _begun(d: Path) -> bool:
    """Whether a round directory holds anything but its config record (a step of it has begun)."""
    return any(p.name != CONFIG_FILE for p in d.iterdir())


def begun_rounds(run_dir: Path) -> int:
    """The last round a step has begun in (0: none beyond round 0's eval)."""
    return max((r for r, d in round_dirs(run_dir).items() if _begun(d)), default=0)


def made_nothing(run_dir: Path) -> bool:
    """No step has made anything yet (a first invocation refused or stopped before its first output): the run
    holds its config and the rounds' records of it, nothing made with them."""
    return not any((run_dir / d).exists() for d in BEFORE_ROUNDS) and not any(_begun(d) for d in round_dirs(run_dir).values())


BASE_KEYS = ("warm_start.init_model", "warm_start.model_seed", "warm_start.model_preset")  # what base/ is built from


def _made_with(run_dir: Path, key: str) -> bool:
    """Whether something the run made depends on ``key``: a round begun (round 0's eval included) on all of them, the
    warm start on all but the verifier's and rewards' (``score.*``), the built base model on the model and its own keys."""
    if any(_begun(d) for d in round_dirs(run_dir).values()):
        return True
    if (run_dir / "warmstart").exists() and not key.startswith("score."):
        return True
    return (run_dir / "base").exists() and (key == "model" or key in BASE_KEYS)


def _frozen(keys: list[str], cfg: IterateConfig, run_dir: Path) -> list[str]:
    """The keys among ``keys`` that cannot change, each with why."""
    out = [f"{k} ({why})" for k in keys for prefix, why in FROZEN.items() if (k == prefix or k.startswith(prefix + ".")) and _made_with(run_dir, k)]
    sampled = any((d / "samples").exists() for r, d in round_dirs(run_dir).items() if r >= 1)
    if cfg.replay_rounds > 0 and sampled:  # the next round would curate its samples with an earlier round's, of another distribution
        out += [f"{k} (the sampling distribution, while replay_rounds > 0)" for k in keys if k in SAMPLING_KEYS]
    return out


def _check_replayed_sampling(run_dir: Path, cfg: IterateConfig, done: int) -> None:
    """The next round curates its samples with the ``replay_rounds`` before it, which one training set holds only
    if they were drawn from one distribution (as recorded by each round, whatever changed since)."""
    now = config_to_dict(cfg)
    for q in range(max(1, done + 1 - cfg.replay_rounds), done + 1):
        recorded = round_config(run_dir, q)
        differ = [k for k in changed_keys(config_to_dict(recorded), now) if k in SAMPLING_KEYS] if recorded else []
        if differ:
            raise UserError(f"round {q} sampled with another {differ[0]} than the config's, and replay_rounds {cfg.replay_rounds} "
                            f"would curate round {done + 1}'s samples with its — keep its sampling, or lower replay_rounds")


def setting_changes(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """The settings two recorded configs differ in: not where a run lives, how many rounds it has, what it reports to,
    or how its steps run (memory, workers: ``RESOURCE_KEYS``, which apply at once)."""
    if a is None or b is None:
        return []
    how = {"run_dir", "rounds", *RESOURCE_KEYS, *WARM_START_RESOURCES}
    return sorted(k for k in changed_keys(a, b) if k not in how and not k.startswith("tracking."))


def reconcile(run_dir: Path, cfg: IterateConfig, *, apply_from_next_round: bool, write: bool = True, recorded_file: Path | None = None) -> list[str]:
    """Check ``cfg`` against the run's recorded config (``recorded_file``: topr's copy, when the run's was edited) and
    (``write``) record it; returns the keys that changed.

    Raises :class:`UserError` for a change that is refused (with the key and why)."""
    path, resolved = Path(run_dir) / CONFIG_FILE, config_to_dict(cfg)
    if not path.exists():
        if write:
            write_text_atomic(path, config_yaml(resolved))
        return []
    # Read back through the schema: a key added to toprcli since the run started takes its default, which
    # is how the run behaved, so it is no change (a removed or moved key is one error listing them).
    recorded = _auto_as_now(config_to_dict(_recorded(recorded_file or path)), resolved)
    # A run may move; trackers may be added or changed (the metrics are the same, the tracked run resumes).
    changed = sorted(k for k in changed_keys(recorded, resolved) - {"run_dir"} if not k.startswith("tracking."))
    if changed and made_nothing(run_dir):  # nothing was made with the old config (a typo refused at once): the new one replaces it
        if write:
            for d in round_dirs(run_dir).values():
                (d / CONFIG_FILE).unlink(missing_ok=True)
            write_text_atomic(path, config_yaml(resolved))
        return changed
    begun = begun_rounds(run_dir)  # a round in progress counts: lowering rounds below it would drop its work in silence
    if cfg.rounds < begun:
        raise UserError(f"run dir {run_dir} has begun round {begun}; rounds {cfg.rounds} would drop it — set rounds >= {begun}, or pass a new --run-dir")
    others = setting_changes(recorded, resolved)  # resources apply at once
    if frozen := _frozen(others, cfg, run_dir):  # a branch inherits them too: only a new run can take another value
        raise UserError(f"run dir {run_dir}: {', '.join(frozen)} cannot change — what the run made (its starting policy, rounds) used "
                        "the old value; start a new --run-dir")
    _check_replayed_sampling(run_dir, cfg, trained_rounds(run_dir))
    if others and not apply_from_next_round:
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        raise UserError(f"run dir {run_dir} was started with a different config (changed: {shown}) — pass --apply-from-next-round "
                        "to use it from the next round on (and for the steps the round in progress has not begun), rerun with the "
                        "original config, or pass a new --run-dir")
    # The round in progress (and one recorded, not begun) takes what its steps to come use; validated whole first.
    # Round 0 is the warm start (frozen once begun) and round 0's eval: it takes the eval keys until its eval begins.
    updates = {r: data for r in range(begun, max(round_dirs(run_dir), default=0) + 1)
               if (data := _round_in_progress(run_dir, r, others if r else _round_zero_keys(run_dir, others), resolved)) is not None}
    if others and begun >= cfg.rounds and not updates:  # recorded, it would say the run used what no round did
        raise UserError(f"run dir {run_dir} has begun all its {cfg.rounds} rounds: {', '.join(others[:5])}{' ...' if len(others) > 5 else ''} "
                        f"would apply to no step left — extend it (--rounds {cfg.rounds + 1} --apply-from-next-round), or pass a new --run-dir")
    if changed and write:
        for r, data in updates.items():  # the rounds first: a kill before the run's record is written leaves the change to do
            write_text_atomic(round_dir(run_dir, r) / CONFIG_FILE, config_yaml(data))
        write_text_atomic(path, config_yaml(resolved))
    return changed


def round_records(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Each round's recorded config, as written (a round not yet recorded: absent)."""
    return {r: yaml.safe_load((d / CONFIG_FILE).read_text()) or {} for r, d in round_dirs(run_dir).items() if (d / CONFIG_FILE).exists()}


def where_changes_apply(run_dir: Path, changed: list[str], before: dict[int, dict[str, Any]]) -> dict[str, str]:
    """Each setting ``reconcile`` changed, and where it applies: ``at once`` (``RESOURCE_KEYS``), or ``from round N``, the
    first round whose record it changed (the round in progress, for the steps it had not begun; ``before``: the records
    before it), else the next round to begin."""
    after, out = round_records(run_dir), {}
    for key in (k for k in changed if k != "rounds"):
        took = [r for r in after if value_at(after[r], key) != value_at(before.get(r, {}), key)]
        first = 0 if not after or key.startswith("warm_start.") else min(took) if took else max(after) + 1  # nothing made yet, or the warm start's
        out[key] = "at once" if key in RESOURCE_KEYS or key in WARM_START_RESOURCES else f"from round {first}"
    return out


WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")


def prune_policy(run_dir: Path, r: int) -> int:
    """Remove round ``r``'s policy weights (``keep_policies``), keeping its config, tokenizer and training records
    (report, resume and lineage read them) and a ``pruned.json`` that says what went and when. The bytes freed."""
    policy = round_dir(run_dir, r) / "policy"
    files = sorted(f for pattern in WEIGHT_FILES for f in policy.glob(pattern))
    freed = sum(st.st_size for f in files if (st := f.lstat()).st_nlink == 1 and not f.is_symlink())  # a branch's links free nothing
    write_json_atomic(policy / PRUNED_FILE, {"removed": [f.name for f in files], "bytes": freed, "at": time.strftime("%Y-%m-%d %H:%M:%S")})
    for f in files:  # after the record: a kill midway leaves a policy marked pruned, never one that looks whole
        f.unlink(missing_ok=True)
    return freed


def pruned(run_dir: Path, r: int) -> bool:
    return (round_dir(run_dir, r) / "policy" / PRUNED_FILE).is_file()


def _round_zero_keys(run_dir: Path, keys: list[str]) -> list[str]:
    """What round 0 (the warm start, then its eval) takes of ``keys``: the eval's until its eval begins, and the
    verifier's (``score.*``: round 0's eval judges with it) until then too."""
    eval_begun = (round_dir(run_dir, 0) / "eval").exists()
    return [k for k in keys if _STEP_OF.get(k, k.split(".")[0]) == "eval" or (k.startswith("score.") and not eval_begun)]


# The step a key configures, for the keys that are not a stage's own section.
_STEP_OF = {"replay_rounds": "curate", "replay_weight": "curate", "train_from": "train", "eval_every": "eval"}
# What a round's step has made once it has begun (a killed step's partial output included).
_BEGUN = {"generate": ("samples",), "score": ("scored",), "curate": ("train.parquet",), "train": ("policy", "policy.partial"), "eval": ("eval",)}


def _round_in_progress(run_dir: Path, r: int, keys: list[str], resolved: dict[str, Any]) -> dict[str, Any] | None:
    """Round ``r``'s recorded config with the changed ``keys`` of the steps it has not begun (None: nothing to change): a
    setting that makes a later step of it fail can be fixed without losing the steps it finished. A change that would
    hold only in part (train.loss dpo where curate, begun, made no pairs) leaves the round as recorded, and says so."""
    path, d = round_dir(run_dir, r) / CONFIG_FILE, round_dir(run_dir, r)
    if not path.exists():
        return None
    data, applied = yaml.safe_load(path.read_text()) or {}, False
    for key in keys:
        step = _STEP_OF.get(key, key.split(".")[0])
        if step not in _BEGUN or any((d / name).exists() for name in _BEGUN[step]) or (step == "curate" and any(d.glob(".train.parquet.*"))):
            continue
        *parents, leaf = key.split(".")
        node, value = data, resolved
        for part in parents:
            node, value = node.setdefault(part, {}), value[part]
        if leaf in value:
            node[leaf] = value[leaf]
        else:  # a key inside a mapping that the new config removed (a misspelt loss option)
            node.pop(leaf, None)
        applied = True
    if not applied:
        return None
    try:
        from_dict(IterateConfig, data)
    except ConfigError as e:
        warnings.warn(f"round {r} keeps its recorded settings (the change applies from round {r + 1}): its steps that have begun "
                      f"ran with the old ones, and the rest of the change alone does not hold — {e}", stacklevel=3)
        return None
    return data


def round_config(run_dir: Path, r: int, current: IterateConfig | None = None) -> IterateConfig | None:
    """The config round ``r`` ran (or runs) with, when it has started; with ``current``, its RESOURCE_KEYS are today's."""
    path = round_dir(run_dir, r) / CONFIG_FILE
    if not path.exists():
        return None
    data = read_yaml(path)
    for key in RESOURCE_KEYS if current is not None else ():
        *parents, leaf = key.split(".")
        node, value = data, current
        for part in parents:
            node, value = node.setdefault(part, {}), getattr(value, part)
        node[leaf] = getattr(value, leaf)
    if current is not None:  # the warm start's resources: today's where the config sets them, else the train section's (above)
        warm = data.setdefault("warm_start", {}).setdefault("train", {})
        for k in TRAIN_RESOURCES:
            warm.pop(k, None)
            if k in current.warm_start.train:
                warm[k] = current.warm_start.train[k]
    return _recorded(path, data)


def _auto_as_now(recorded: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """A record's ``score.verifier: auto`` (a run recorded before auto was resolved first) as what it stands for now:
    the dataset it reads is frozen, so it names the verifier the run used."""
    if recorded.get("score", {}).get("verifier") == "auto":
        return {**recorded, "score": {**recorded["score"], "verifier": now["score"]["verifier"]}}
    return recorded


def _recorded(path: Path, data: dict[str, Any] | None = None) -> IterateConfig:
    """A config the run recorded, read through today's schema; a key it no longer takes is named with the file."""
    try:
        return from_dict(IterateConfig, read_yaml(path) if data is None else data)
    except ConfigError as e:
        raise ConfigError(f"{path} (the run's record): {e}") from None


def record_round(run_dir: Path, r: int, cfg: IterateConfig) -> None:
    path = round_dir(run_dir, r) / CONFIG_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, config_yaml(cfg))


# -- branching ----------------------------------------------------------------------------


def parse_branch(source: str) -> tuple[Path, int]:
    """``RUN/round-00k`` → (RUN, k), checked: round k of RUN is complete."""
    path = Path(source)
    k = _round_number(path)
    if k < 0 or not (path.parent / CONFIG_FILE).exists():
        raise UserError(f"--branch-from {source}: not a round of a `topr iterate` run — write RUN_DIR/round-00K")
    if k > 0 and not (path / "policy" / "config.json").exists() or k == 0 and not (path / "eval" / "eval.json").exists():
        raise UserError(f"--branch-from {source}: round {k} is not complete — finish it first (rerun that run)")
    if k > 0 and pruned(path.parent, k):  # its policy is where the branch starts
        raise UserError(f"--branch-from {source}: round {k}'s weights were removed by the run's keep_policies — branch from a later round")
    return path.parent, k


def _round_number(path: Path) -> int:
    """k of ``RUN/round-00k``, else -1."""
    m = _ROUND_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else -1


def recorded_config_file(run_dir: str | None, branch_from: str | None) -> tuple[Path, str] | None:
    """The config a run goes on with when none is given: an existing run dir's (``"run"``), else what a branch's round
    ran with (``"round"``: its own record, else its run's), else None."""
    if run_dir and (path := Path(run_dir) / CONFIG_FILE).is_file():
        return path, "run"
    for path in (Path(branch_from) / CONFIG_FILE, Path(branch_from).parent / CONFIG_FILE) if branch_from else ():
        if path.is_file():
            return path, "round"
    return None


def branch(source: str, run_dir: Path, cfg: IterateConfig) -> dict[str, Any] | None:
    """Start ``run_dir`` from round k of another run (once; a rerun finds it done). Returns the lineage."""
    if (run_dir / LINEAGE_FILE).exists():  # written last: the branch is complete
        lineage = json.loads((run_dir / LINEAGE_FILE).read_text())
        if (lineage["parent"], lineage["round"]) != (str(Path(source).parent.resolve()), _round_number(Path(source))):
            raise UserError(f"--branch-from {source}: {run_dir} is a branch of {lineage['parent']} at round {lineage['round']} — "
                            "branch into a new --run-dir")
        return lineage
    if (run_dir / CONFIG_FILE).exists():
        raise UserError(f"--branch-from: {run_dir} is already a run — branch into a new --run-dir")
    parent, k = parse_branch(source)
    if cfg.rounds <= k:
        raise UserError(f"--branch-from {source}: set rounds > {k} (the branch continues from round {k + 1})")
    # What round k ran with, read through the schema (keys added since take their defaults, as in reconcile).
    parent_cfg = config_to_dict(round_config(parent, k) or from_dict(IterateConfig, yaml.safe_load((parent / CONFIG_FILE).read_text()) or {}))
    changed = setting_changes(_auto_as_now(parent_cfg, config_to_dict(cfg)), config_to_dict(cfg))  # as reconcile counts them
    if frozen := _frozen(changed, cfg, parent):  # the inherited rounds were made with the parent's values
        raise UserError(f"--branch-from {source}: {', '.join(frozen)} differs from the parent's — the inherited rounds used the parent's")
    _check_replayed_sampling(parent, cfg, k)  # round k + 1 curates with the inherited rounds' samples, as an extension would
    tmp = run_dir.with_name(run_dir.name + ".branching")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed branch starts over: nothing in it is the run yet
    how = {"hardlink"}
    for name in [*BEFORE_ROUNDS, *(f"round-{r:03d}" for r in range(k + 1))]:
        if (parent / name).exists():
            _link_tree(parent / name, tmp / name, how)
    for r in range(k + 1):  # rounds of runs older than per-round records ran with the parent's config
        if not (tmp / f"round-{r:03d}" / CONFIG_FILE).exists() and (tmp / f"round-{r:03d}").exists():
            write_text_atomic(tmp / f"round-{r:03d}" / CONFIG_FILE, config_yaml(parent_cfg))
    lineage = {"parent": str(parent.resolve()), "round": k, "changed": changed, "links": sorted(how)[-1]}
    write_json_atomic(tmp / LINEAGE_FILE, lineage)
    tmp.rename(run_dir) if not run_dir.exists() else _merge_into(tmp, run_dir)
    return lineage


def _unfinished(path: Path) -> bool:
    """Work in progress the branch must not inherit: the child redoes it as its own (an eval begun for the parent's
    policy path would be refused as another model's), and a writer's temporaries and locks are the parent's."""
    return path.name.endswith((".partial", ".tmp", ".lock")) or path.name == "eval" and path.is_dir() and not (path / "eval.json").exists()


def _link_tree(src: Path, dst: Path, how: set[str]) -> None:
    """Recreate ``src``'s directories under ``dst`` with every finished file a hard link (a symlink across filesystems)."""
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not _unfinished(Path(root) / d)]
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in (f for f in files if not _unfinished(Path(root) / f)):
            try:
                os.link(Path(root) / f, target / f)
            except OSError:  # another filesystem: a reference to the parent's file
                os.symlink((Path(root) / f).resolve(), target / f)
                how.add("symlink")


def _merge_into(tmp: Path, run_dir: Path) -> None:
    """``run_dir`` exists but holds no run (the command's log, a directory the user made): move the branch's
    entries in, the lineage last, since it marks the branch complete; what a killed merge moved is replaced."""
    for entry in sorted(tmp.iterdir(), key=lambda e: e.name == LINEAGE_FILE):
        target = run_dir / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        entry.rename(target)  # a file is replaced in one step
    tmp.rmdir()


# -- what the rounds recorded ------------------------------------------------------


def round_summary(run_dir: Path, r: int) -> dict[str, Any]:
    """Per-round numbers gathered from the files a round wrote."""
    d = round_dir(Path(run_dir), r)
    out: dict[str, Any] = {"round": r}
    ev = eval_stage.read_eval(d / "eval")
    if ev is not None:
        m = ev["metrics"]
        out.update({"pass@1": m["pass@1"], "maj@k": m["maj@k"], "pass@k": m["pass@k"], "k": ev["k"], "invalid_rate": m["invalid_rate"], "greedy_accuracy": m.get("greedy_accuracy")})
        out.update({key: m[key] for key in ("error_rate", "greedy_error_rate", "truncated_rate") if m.get(key) is not None})  # evals before them have none
        if "intervals" in m:  # 95% percentile bootstrap over prompts (evals written before they existed have none)
            out.update({"intervals": m["intervals"], "bootstrap": m["bootstrap"]})
        out.update({key: m[key] for key in VERIFIER_KEYS if key in m})
    curated = d / "train.parquet"
    if curated.exists():
        meta = read_file_metadata(curated)
        out.update({key: meta[key] for key in ("p", "c", "p_effective", "p_target", "rows_out") if key in meta})
        out.update(trained_share(value_at(yaml.safe_load((d / CONFIG_FILE).read_text()) or {}, "train.loss") if (d / CONFIG_FILE).is_file() else None, out))
    summary = d / "policy" / "train_summary.json"
    if summary.exists():
        s = read_json(summary)
        for key in ("final_loss", "steps", "tokens_per_s", "behavior_gap_mean"):
            if key in s:
                out[f"train_{key}"] = s[key]
    return out


def trained_share(loss: Any, row: dict[str, Any]) -> dict[str, Any]:
    """p̃ as the round's ``loss`` trains: the data's, but 1 where no negative carries gradient (sft), none for pairs (dpo)."""
    spec = LOSSES.get(str(loss))
    if spec is None or row.get("p_effective") is None or spec.trains_negatives and not spec.pairwise:
        return {}
    return {"p_effective": None if spec.pairwise or not row.get("p") else 1.0}


def run_summary(run_dir: str | Path) -> list[dict[str, Any]]:
    run_dir = Path(run_dir)
    return [round_summary(run_dir, r) for r in round_dirs(run_dir)]
