"""Runs a researcher can grow, branch and compare: `topr iterate` extended, changed from the next round,
branched from a round, killed and resumed; `topr report` over several runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import KILLER
from toprcli.cli.main import app

pytestmark = pytest.mark.integration

MICRO = """
run_dir: {run_dir}
rounds: 1
warm_start: {{init_model: true}}
generate:
  dataset: {{source: builtin:arith, split: train, level: 1, size: 8}}
  n: 2
  sampling: {{max_new_tokens: 16}}
  engine: {{backend: hf}}
  shard_size: 4
score: {{verifier: gsm8k, workers: 1}}
curate: {{positive_fraction: 0.5, unreachable_baseline: 0.0}}
train: {{loss: topr, optimizer: adamw, lr: 1.0e-3, batch_size: 4, save_every: 1}}
eval:
  dataset: {{source: builtin:arith, split: test, level: 1, size: 4}}
  k: 2
  sampling: {{max_new_tokens: 16}}
  engine: {{backend: hf}}
"""


def iterate(config: Path, *args: str) -> str:
    r = CliRunner().invoke(app, ["iterate", "-c", str(config), "--no-report", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    return r.output


def refused(config: Path, *args: str) -> str:
    r = CliRunner().invoke(app, ["iterate", "-c", str(config), "--no-report", "--no-progress", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def digests(root: Path) -> dict[str, tuple[str, int]]:
    """Every file below ``root``: its sha256 and modification time (untouched means both equal)."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def one_round(tmp_path_factory) -> tuple[Path, Path]:
    """A finished 1-round run (tiny model, hf backend), shared by the tests that only read it or branch from it."""
    root = tmp_path_factory.mktemp("runs")
    config = root / "micro.yaml"
    config.write_text(MICRO.format(run_dir=root / "base-run"))
    iterate(config)
    return config, root / "base-run"


def test_extend_a_finished_run_and_change_the_lr_from_the_next_round(tmp_path):
    config = tmp_path / "micro.yaml"
    config.write_text(MICRO.format(run_dir=tmp_path / "run"))
    run = tmp_path / "run"
    assert "after round 1" in iterate(config)  # --no-progress (a batch job): each round's table as it ends, on stderr
    round1 = digests(run / "round-001")
    # --run-dir alone goes on with the run's recorded config (it ran the demo's and refused every key that differs).
    r = CliRunner().invoke(app, ["iterate", "--run-dir", str(run), "--no-report", "--no-progress"])
    assert r.exit_code == 0 and f"goes on with its recorded config ({run / 'config.yaml'})" in r.stderr, r.output
    # A changed lr is refused without the flag, named with the way out.
    line = refused(config, "--rounds", "2", "--set", "train.lr=5e-4")
    assert "changed: train.lr" in line and "--apply-from-next-round" in line
    # Raising rounds extends the run, the new lr applies from round 2; round 1 stays byte for byte what it was.
    assert "changed: train.lr from round 2" in iterate(config, "--rounds", "2", "--set", "train.lr=5e-4", "--apply-from-next-round")
    assert (run / "round-002" / "eval" / "eval.json").exists() and digests(run / "round-001") == round1
    lrs = [yaml.safe_load((run / f"round-00{r}" / "config.yaml").read_text())["train"]["lr"] for r in (1, 2)]
    assert lrs == [1e-3, 5e-4]
    rows = json.loads(CliRunner().invoke(app, ["report", str(run), "--json"]).stdout)
    assert [r.get("config_changed") for r in rows[1:]] == [[], ["train.lr"]]
    assert "Round 2 ran with changed settings: train.lr" in (run / "report" / "summary.md").read_text()
    # What cannot change, and rounds below what is trained, are refused with the reason.
    line = refused(config, "--rounds", "2", "--set", "train.lr=5e-4", "--set", "generate.dataset.size=6", "--apply-from-next-round")
    assert "generate.dataset.size (the training data) cannot change" in line
    assert "has begun round 2; rounds 1 would drop it" in refused(config, "--rounds", "1", "--set", "train.lr=5e-4")
    # An eval setting may change, and report says the rounds are no longer comparable.
    iterate(config, "--rounds", "3", "--set", "eval.k=3", "--apply-from-next-round", "--set", "train.lr=5e-4")
    rows = json.loads(CliRunner().invoke(app, ["report", str(run), "--json"]).stdout)
    assert [r["eval_comparable"] for r in rows] == [True, True, True, False]
    assert "not comparable" in (run / "report" / "summary.md").read_text()


def test_branch_reuses_the_parent_round_and_reports_its_lineage(one_round, tmp_path):
    config, parent = one_round
    child = tmp_path / "child"
    out = iterate(config, "--run-dir", str(child), "--rounds", "2", "--set", "train.lr=5e-4", "--branch-from", str(parent / "round-001"))
    assert "branch of" in out
    for name in ("policy/model.safetensors", "train.parquet", "eval/eval.json"):
        a, b = (parent / "round-001" / name).stat(), (child / "round-001" / name).stat()
        assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev), name  # the same file, not a copy
    assert (child / "round-002" / "policy" / "config.json").exists() and not (parent / "round-002").exists()
    lineage = json.loads((child / "lineage.json").read_text())
    assert lineage == {"parent": str(parent.resolve()), "round": 1, "changed": ["train.lr"], "links": "hardlink"}
    assert yaml.safe_load((child / "round-002" / "config.yaml").read_text())["train"]["lr"] == 5e-4
    report = CliRunner().invoke(app, ["report", str(child)])
    assert report.exit_code == 0 and f"Branched from {parent.resolve()} at round 1" in (child / "report" / "summary.md").read_text()
    rows = json.loads(CliRunner().invoke(app, ["report", str(child), "--json"]).stdout)
    assert rows[2]["config_changed"] == ["train.lr"]  # not run_dir: the inherited rounds recorded the parent's
    # Runs compared: both series, named by what differs, the plot on disk.
    r = CliRunner().invoke(app, ["report", str(parent), str(child), "--out", str(tmp_path / "cmp"), "--json"])
    assert r.exit_code == 0, r.output
    runs, variants = json.loads(r.stdout)["runs"], json.loads(r.stdout)["variants"]
    assert [run["label"] for run in runs] == [v["label"] for v in variants] == ["base-run", "child (train.lr=0.0005 from round 2)"]  # rounds 0-1 are the parent's
    assert [len(run["rounds"]) for run in runs] == [2, 3] and runs[1]["lineage"]["round"] == 1
    paired = variants[1]["paired_vs_first"]  # child's round 2 against the parent's round 1, over the same 4 test prompts
    assert paired["rounds"] == [1, 2] and paired["pass@1"]["prompts"] == 4
    lo, hi = paired["pass@1"]["interval"]
    assert lo <= paired["pass@1"]["difference"] <= hi and paired["pass@1"]["outside_noise"] == (lo > 0 or hi < 0)
    parent_rows = json.loads(CliRunner().invoke(app, ["report", str(parent), "--json"]).stdout)
    assert runs[0]["rounds"][1]["pass@1"] == parent_rows[1]["pass@1"] == runs[1]["rounds"][1]["pass@1"]  # the shared round
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 10_000 and "child (train.lr=0.0005 from round 2)" in (tmp_path / "cmp" / "compare.md").read_text()
    # A branch must not change what the inherited rounds were made with.
    line = refused(config, "--run-dir", str(tmp_path / "bad"), "--rounds", "2", "--set", "score.verifier=math", "--branch-from", str(parent / "round-001"))
    assert "score.verifier (the verifier) differs from the parent's" in line and not (tmp_path / "bad").exists()


def test_the_python_api_branches_a_run_before_any_work(one_round, tmp_path):
    """``Pipeline(branch_from=...)`` makes the branch itself (under the run dir's lock) and hands its lineage to
    ``on_start`` before the first step: stopping there leaves the branch made and round 2 not begun."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline

    config, parent = one_round
    child = tmp_path / "child"
    cfg = load_config(IterateConfig, config, {"run_dir": str(child), "rounds": 2})
    seen: list = []

    class Stop(Exception):
        pass

    def on_start(lineage):
        seen.append(lineage)
        raise Stop

    with pytest.raises(Stop):
        Pipeline(cfg, on_start=on_start, branch_from=str(parent / "round-001")).run()
    assert seen == [{"parent": str(parent.resolve()), "round": 1, "changed": [], "links": "hardlink"}]
    a, b = (parent / "round-001" / "policy" / "model.safetensors").stat(), (child / "round-001" / "policy" / "model.safetensors").stat()
    assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev) and not (child / "round-002").exists()
    assert yaml.safe_load((child / "config.yaml").read_text())["rounds"] == 2  # the config the branch runs with, recorded
    with pytest.raises(Exception, match="set rounds > 1"):  # the same checks as the command's
        Pipeline(load_config(IterateConfig, config, {"run_dir": str(tmp_path / "c2")}), branch_from=str(parent / "round-001")).run()


@pytest.mark.parametrize("how", ["extend", "branch"])
def test_a_kill_during_an_extension_or_a_branch_resumes_cleanly(one_round, tmp_path, how):
    config, parent = one_round
    run = tmp_path / "run"
    if how == "extend":
        subprocess.run(["cp", "-a", str(parent), str(run)], check=True)
        args = ["--run-dir", str(run), "--rounds", "2"]
    else:
        args = ["--run-dir", str(run), "--rounds", "2", "--branch-from", str(parent / "round-001")]
    cmd = [sys.executable, str(KILLER), "iterate", "-c", str(config), "--no-report", "--no-progress", *args]
    killed = subprocess.run(cmd, env={**os.environ, "KILL_AFTER_CHECKPOINT": "1"}, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (run / "round-002" / "policy.partial" / "checkpoints").is_dir() and not (run / "round-002" / "policy").exists()
    iterate(config, *args)
    steps = [json.loads(line)["step"] for line in (run / "round-002" / "policy" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and (run / "round-002" / "eval" / "eval.json").exists()


def test_a_key_added_to_toprcli_since_the_run_started_is_no_change(tmp_path):
    """A run recorded before an option existed resumes: the new key takes its default, as the run behaved."""
    import yaml

    from toprcli.config import IterateConfig, config_to_dict
    from toprcli.runs import reconcile

    cfg = IterateConfig(run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    old = config_to_dict(cfg)
    del old["train"]["shared_prefix"], old["curate"]["pairs"]  # as written by an older toprcli
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(old))
    assert reconcile(tmp_path / "run", cfg, apply_from_next_round=False) == []


def test_a_sampling_change_is_refused_while_rounds_replay_earlier_ones(tmp_path):
    """With replay_rounds > 0 the next round would curate its samples with an earlier round's, of another
    sampling distribution, which one training set cannot hold: refused up front, instead of a round that fails
    at its curate on every rerun. Without replay it applies from the next round as any change."""
    import yaml

    from toprcli.config import IterateConfig, config_to_dict, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    (run / "base").mkdir(parents=True)  # work made with the recorded config
    cfg = IterateConfig(run_dir=str(run), replay_rounds=1)
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    hotter = load_config(IterateConfig, None, sets={"run_dir": str(run), "replay_rounds": 1, "generate.sampling.temperature": 0.8})
    # Nothing sampled yet (a warm start killed): no sample of another distribution to replay, so the change is taken.
    assert reconcile(run, hotter, apply_from_next_round=True, write=False) == ["generate.sampling.temperature"]
    (run / "round-001" / "samples").mkdir(parents=True)  # round 1 sampled
    with pytest.raises(UserError, match=r"generate.sampling.temperature \(the sampling distribution, while replay_rounds > 0\)"):
        reconcile(run, hotter, apply_from_next_round=True)
    no_replay = load_config(IterateConfig, None, sets={"run_dir": str(run), "generate.sampling.temperature": 0.8})
    assert reconcile(run, no_replay, apply_from_next_round=True, write=False) == ["generate.sampling.temperature", "replay_rounds"]


def test_a_branch_compares_with_the_round_it_starts_from_read_through_the_schema(one_round, tmp_path):
    """A parent recorded by an older toprcli (a key missing) is no change, as in reconcile; tracking is not the run;
    a rerun naming another round is refused rather than silently ignored."""
    import yaml

    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import branch

    config, parent = one_round
    old = tmp_path / "old-parent"
    subprocess.run(["cp", "-a", str(parent), str(old)], check=True)
    for recorded in (old / "config.yaml", old / "round-001" / "config.yaml"):
        data = yaml.safe_load(recorded.read_text())
        del data["train"]["shared_prefix"], data["generate"]["dataset"]["few_shot"]  # as written before those keys existed
        recorded.write_text(yaml.safe_dump(data))
    # How the warm start runs (its threads) is no setting of what the branch inherits (it was refused: 'the starting policy').
    cfg = load_config(IterateConfig, config, {"run_dir": str(tmp_path / "child"), "rounds": 2},
                      sets={"tracking.project": "p", "warm_start.train.threads": "2"})
    lineage = branch(str(old / "round-001"), tmp_path / "child", cfg)
    assert lineage["changed"] == [] and lineage["round"] == 1
    with pytest.raises(UserError, match="is a branch of .* at round 1"):
        branch(str(old / "round-000"), tmp_path / "child", cfg)


def test_a_killed_merge_into_an_existing_run_dir_completes_on_the_rerun(tmp_path, monkeypatch):
    """The command has already made RUN_DIR (its log), so a branch is merged in entry by entry: the lineage,
    which marks the branch complete, goes last, and an entry a killed merge moved is replaced."""
    from toprcli import runs

    def branching() -> Path:
        tmp = tmp_path / "run.branching"
        for name in ("round-000", "round-001"):
            (tmp / name).mkdir(parents=True)
            (tmp / name / "eval.json").write_text(name)
        (tmp / runs.LINEAGE_FILE).write_text("{}")
        return tmp

    run = tmp_path / "run"
    run.mkdir()
    (run / "topr.log").write_text("log")
    moved: list[str] = []
    real = Path.rename

    def rename_then_die(self, target):
        if moved:  # killed after the first entry
            raise KeyboardInterrupt
        moved.append(self.name)
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        runs._merge_into(branching(), run)
    monkeypatch.setattr(Path, "rename", real)
    assert moved == ["round-000"] and not (run / runs.LINEAGE_FILE).exists()  # not a complete branch
    shutil.rmtree(tmp_path / "run.branching")  # what branch() does on the rerun before linking again
    runs._merge_into(branching(), run)
    assert sorted(p.name for p in run.iterdir()) == [runs.LINEAGE_FILE, "round-000", "round-001", "topr.log"]
    assert not (tmp_path / "run.branching").exists()


def test_a_warm_start_killed_after_a_checkpoint_resumes_with_its_own_settings(tmp_path):
    """The warm start records its config (as round 0's) when it begins: rerun with a train setting changed for the
    next rounds, it resumes from its checkpoint with the settings it began with (it was refused: 'checkpoint made
    with a different config — run without --resume', which `topr iterate` cannot do)."""
    import yaml

    config = tmp_path / "micro.yaml"
    run = tmp_path / "run"
    config.write_text(MICRO.format(run_dir=run).replace("warm_start: {init_model: true}",
                                                        "warm_start: {init_model: true, enabled: true, examples: 16, train: {save_every: 1, batch_size: 4}}"))
    cmd = [sys.executable, str(KILLER), "iterate", "-c", str(config), "--no-report", "--no-progress"]
    killed = subprocess.run(cmd, env={**os.environ, "KILL_AFTER_CHECKPOINT": "1"}, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9 and (run / "warmstart" / "policy.partial" / "checkpoints").is_dir(), killed.stderr[-2000:]
    iterate(config, "--set", "train.lr=5e-4", "--apply-from-next-round")
    assert yaml.safe_load((run / "round-000" / "config.yaml").read_text())["train"]["lr"] == 1e-3
    assert yaml.safe_load((run / "round-001" / "config.yaml").read_text())["train"]["lr"] == 5e-4
    assert json.loads((run / "warmstart" / "policy" / "train_summary.json").read_text())["resumed_from_step"] == 1


def _recorded_run(run, rounds, **changes):
    """A run dir with ``rounds`` trained rounds (their configs recorded; ``changes`` set in round 1's)."""
    from toprcli.config import IterateConfig, config_to_dict, load_config

    cfg = IterateConfig(run_dir=str(run), rounds=rounds)
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    for r in range(1, rounds + 1):
        (run / f"round-{r:03d}" / "policy").mkdir(parents=True)
        (run / f"round-{r:03d}" / "policy" / "config.json").write_text("{}")
        round_cfg = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": rounds, **(changes if r == 1 else {})})
        (run / f"round-{r:03d}" / "config.yaml").write_text(yaml.safe_dump(config_to_dict(round_cfg)))
    return cfg


def test_keep_policies_removes_old_rounds_weights_and_the_run_goes_on(tmp_path):
    """Every round kept a whole policy (32 GB a round for an 8B model saved in float32) and nothing pruned them; deleting
    one by hand made the next invocation train that round again. keep_policies N removes the weights of the rounds before
    the last N once nothing left needs them (records kept, marked pruned.json), on a finished run too (it applies at once)."""
    config = tmp_path / "micro.yaml"
    config.write_text(MICRO.format(run_dir=tmp_path / "run"))
    run = tmp_path / "run"
    iterate(config, "--rounds", "2")
    weights = {r: sorted(p.name for p in (run / f"round-00{r}" / "policy").glob("*.safetensors")) for r in (1, 2)}
    assert weights[1] and weights[2]
    state = (run / "state.json").read_text()
    assert "changed: keep_policies at once" in iterate(config, "--rounds", "2", "--set", "keep_policies=1")  # no flag needed: retention
    assert (run / "state.json").read_text() == state  # nothing ran again
    pruned = json.loads((run / "round-001" / "policy" / "pruned.json").read_text())
    assert pruned["removed"] == weights[1] and pruned["bytes"] > 0 and not list((run / "round-001" / "policy").glob("*.safetensors"))
    assert (run / "round-001" / "policy" / "train_summary.json").is_file() and sorted((run / "round-002" / "policy").glob("*.safetensors"))
    iterate(config, "--rounds", "3", "--set", "keep_policies=1")  # round 3 trains from round 2's, kept until round 3 ends
    assert (run / "round-002" / "policy" / "pruned.json").is_file() and list((run / "round-003" / "policy").glob("*.safetensors"))
    rows = json.loads(CliRunner().invoke(app, ["report", str(run), "--json"]).stdout)
    assert [r["round"] for r in rows] == [0, 1, 2, 3] and all(r.get("pass@1") is not None for r in rows)
    r = CliRunner().invoke(app, ["eval", "-m", str(run / "round-001" / "policy"), "-d", "builtin:arith", "-o", str(tmp_path / "ev"), "--backend", "hf"])
    assert r.exit_code == 2 and "its weights were removed by the run's keep_policies" in r.output
    assert "round 1's weights were removed by the run's keep_policies" in refused(config, "--run-dir", str(tmp_path / "branch"),
                                                                                  "--branch-from", str(run / "round-001"))
    assert not (tmp_path / "branch").exists()


def test_report_says_whether_an_unfinished_run_is_running_or_stopped(one_round, tmp_path):
    """An unfinished round read the same whether its run was running or had stopped: report names the live holder of the
    run's lock, or says the run stopped."""
    from toprcli.shards import output_lock

    run = tmp_path / "run"
    shutil.copytree(one_round[1], run)
    shutil.rmtree(run / "round-001" / "eval")  # round 1 not evaluated yet
    report = ["report", str(run), "--out", str(tmp_path / "report")]
    with output_lock(run):  # the run's `topr iterate`
        assert f"running: pid {os.getpid()} on " in CliRunner().invoke(app, report).output
    out = CliRunner().invoke(app, report).output
    assert "stopped: the same `topr iterate` resumes it" in out and "running:" not in out


def test_iterate_says_where_each_changed_setting_applies(tmp_path):
    """`--apply-from-next-round` printed nothing, and the round in progress took a changed train.lr for its training
    (as documented, not as the flag's name says): each change is named with the round it applies from, or `at once`."""
    from toprcli.config import IterateConfig, config_to_dict, load_config
    from toprcli.runs import reconcile, round_records, where_changes_apply

    run = tmp_path / "run"
    _recorded_run(run, 3)
    shutil.rmtree(run / "round-003" / "policy")  # round 3 curated, not trained
    for made in ("samples", "scored"):
        (run / "round-003" / made).mkdir()
    (run / "round-003" / "train.parquet").write_text("")
    new = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 5, "train.lr": 5e-4, "generate.sampling.temperature": 0.9,
                                                 "train.micro_batch_tokens": 1024})
    before = round_records(run)
    assert where_changes_apply(run, reconcile(run, new, apply_from_next_round=True), before) == {"generate.sampling.temperature": "from round 4", "train.lr": "from round 3",
                                                     "train.micro_batch_tokens": "at once"}
    back = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 5, "train.micro_batch_tokens": 1024})  # lr as round 1-2 had it
    before = round_records(run)
    assert where_changes_apply(run, reconcile(run, back, apply_from_next_round=True), before)["train.lr"] == "from round 3"
    # Nothing made yet: the new config replaces the recorded one, round 0's eval and the warm start included.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text(yaml.safe_dump(config_to_dict(IterateConfig(run_dir=str(fresh)))))
    typo_fixed = load_config(IterateConfig, None, sets={"run_dir": str(fresh), "train.lr": 5e-4, "warm_start.train.lr": 1e-3})
    assert set(where_changes_apply(fresh, reconcile(fresh, typo_fixed, apply_from_next_round=False), {}).values()) == {"from round 0"}


def test_raising_replay_over_rounds_of_another_sampling_is_refused(tmp_path):
    """Round 1 sampled at T 0.8, round 2 at 1.0: raising replay_rounds to 2 was accepted, and round 3's curate then
    failed on every rerun (one training set holds one distribution), with no config that could undo it."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    _recorded_run(run, 2, **{"generate.sampling.temperature": 0.8})
    more = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 3, "replay_rounds": 2})
    with pytest.raises(UserError, match="round 1 sampled with another generate.sampling.temperature"):
        reconcile(run, more, apply_from_next_round=True, write=False)
    assert reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 3, "replay_rounds": 1}),
                     apply_from_next_round=True, write=False) == ["replay_rounds", "rounds"]


def test_memory_and_worker_settings_apply_at_once_to_a_started_round(tmp_path):
    """A round that ran out of memory: lowering train.micro_batch_tokens needed --apply-from-next-round, and then the
    round kept its recorded value and failed the same way on every rerun."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    _recorded_run(run, 1)
    less = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 1, "train.micro_batch_tokens": 1024,
                                                  "generate.engine.gpu_memory_utilization": 0.5})
    assert reconcile(run, less, apply_from_next_round=False, write=False) == ["generate.engine.gpu_memory_utilization", "train.micro_batch_tokens"]
    started = Pipeline(less).round_cfg(1)
    assert (started.train.micro_batch_tokens, started.generate.engine.gpu_memory_utilization, started.rounds) == (1024, 0.5, 1)


def test_a_branch_leaves_its_parents_unfinished_work_behind(tmp_path):
    """Branching from a round whose eval was killed linked the half-done eval/: the child's eval resumed it with its
    own policy path and was refused as another model's on every rerun. Only finished outputs are linked now."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.runs import branch

    parent = tmp_path / "parent"
    _recorded_run(parent, 1)
    r1 = parent / "round-001"
    (r1 / "eval" / "samples").mkdir(parents=True)
    (r1 / "eval" / "samples" / "shard-00000.parquet").write_text("part")  # an eval killed after a shard: no eval.json
    (r1 / "policy.partial").mkdir()
    (r1 / ".train.parquet.1-abc.tmp").write_text("x")
    (r1 / "train.parquet").write_text("data")
    child = tmp_path / "child"
    branch(str(r1), child, load_config(IterateConfig, None, sets={"run_dir": str(child), "rounds": 2}))
    kept = sorted(p.relative_to(child / "round-001").as_posix() for p in (child / "round-001").rglob("*"))
    assert kept == ["config.yaml", "policy", "policy/config.json", "train.parquet"]


def test_a_run_that_made_nothing_takes_a_corrected_config(tmp_path):
    """A first invocation refused before its first output (a mistyped model) left config.yaml and round-000's
    record: the corrected rerun was refused for good ('model cannot change — the completed rounds were made
    with the old value'), though no round existed. Now a run that made nothing takes the new config."""
    import yaml

    from toprcli.config import IterateConfig, config_to_dict
    from toprcli.errors import UserError
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    (run / "round-000").mkdir(parents=True)
    typo = IterateConfig(run_dir=str(run), model="./nomodel")
    for path in (run / "config.yaml", run / "round-000" / "config.yaml"):
        path.write_text(yaml.safe_dump(config_to_dict(typo)))
    fixed = IterateConfig(run_dir=str(run), model="./models/tiny")
    assert reconcile(run, fixed, apply_from_next_round=False) == ["model"]
    assert yaml.safe_load((run / "config.yaml").read_text())["model"] == "./models/tiny"
    assert not (run / "round-000" / "config.yaml").exists()  # round 0 runs with the new config
    (run / "round-000" / "eval").mkdir()
    (run / "round-000" / "eval" / "eval.json").write_text("{}")  # made with ./models/tiny: now it is frozen
    with pytest.raises(UserError, match=r"model \(the model\) cannot change"):
        reconcile(run, typo, apply_from_next_round=True)


def test_the_base_model_is_checked_until_the_run_has_made_something(tmp_path):
    """A mistyped model is refused before the run dir records anything, and again while nothing was made with it; a
    run already under way whose base model has since been removed (later rounds train from their own policies) is not
    refused for it."""
    from toprcli.config import IterateConfig
    from toprcli.errors import UserError
    from toprcli.pipeline import Pipeline
    from toprcli.runs import reconcile

    cfg = IterateConfig(run_dir=str(tmp_path / "run"), model=str(tmp_path / "gone"))
    with pytest.raises(UserError, match="model dir not found"):
        Pipeline(cfg).prepare()
    assert not (tmp_path / "run").exists()
    reconcile(tmp_path / "run", cfg, apply_from_next_round=False)  # the run as it was recorded when its model existed
    with pytest.raises(UserError, match="model dir not found"):  # nothing made yet: round 0 needs the model, so it is checked
        Pipeline(cfg).prepare()
    (tmp_path / "run" / "round-000" / "eval").mkdir(parents=True)  # under way: its base model's work is done
    (tmp_path / "run" / "round-000" / "eval" / "eval.json").write_text("{}")
    Pipeline(cfg).prepare()


def test_an_unmapped_data_source_is_refused_before_round_0_generates(tmp_path, tiny_model_dir):
    """score.verifier data_source with a verl source the map lacks failed at round 0's scoring, after its generation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toprcli.config import DatasetSpec, EvalConfig, GenerateConfig, IterateConfig, SamplingConfig, ScoreConfig
    from toprcli.errors import UserError
    from toprcli.pipeline import Pipeline

    rows = [{"data_source": "my_math", "prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verl.parquet")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verl-test.parquet")
    short = SamplingConfig(max_new_tokens=16)  # room in tiny's context of 512
    cfg = IterateConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), score=ScoreConfig(verifier="data_source"),
                        generate=GenerateConfig(dataset=DatasetSpec(source=str(tmp_path / "verl.parquet"), chat_template=True), sampling=short),
                        eval=EvalConfig(dataset=DatasetSpec(source=str(tmp_path / "verl-test.parquet"), chat_template=True), sampling=short))
    with pytest.raises(UserError, match="no verifier for data_source my_math — add it: --verifier-by-source my_math=math"):
        Pipeline(cfg).prepare()
    assert not (tmp_path / "run").exists()
    mapped = IterateConfig(**{**cfg.__dict__, "score": ScoreConfig(verifier="data_source", verifier_by_source={"my_math": "math"})})
    Pipeline(mapped).prepare()


def test_the_round_in_progress_takes_a_change_for_the_steps_it_has_not_begun(tmp_path):
    """Round 3 generated and scored, then its curate failed on a setting (reward_clip with positive_fraction): the fix
    was refused without --apply-from-next-round and ignored with it (the round kept its recorded config), a dead end.
    A step it has begun keeps its settings; lowering rounds below it is refused, not a silent drop of its work."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile, round_config

    run = tmp_path / "run"
    _recorded_run(run, 2, **{"curate.reward_clip": 3.0, "train.loss_options": {"negativ_weight": 0.5}})
    (run / "round-001" / "samples").mkdir()  # round 1: generated, scored, its curate not begun
    (run / "round-001" / "scored").mkdir()
    (run / "round-001" / "policy" / "config.json").unlink()
    (run / "round-001" / "policy").rmdir()
    (run / "round-002" / "policy" / "config.json").unlink()
    (run / "round-002" / "policy").rmdir()  # round 2: recorded, nothing begun
    (run / "config.yaml").write_text(yaml.safe_dump(yaml.safe_load((run / "round-001" / "config.yaml").read_text())))  # as the run began
    fixed = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 2, "generate.sampling.temperature": 0.5,
                                                   "curate.reward_clip": 2.0, "train.loss_options": {"negative_weight": 0.5}})
    reconcile(run, fixed, apply_from_next_round=True)
    first, second = round_config(run, 1), round_config(run, 2)
    assert first.curate.reward_clip == 2.0 and first.generate.sampling.temperature == 1.0  # its generate had begun
    assert first.train.loss_options == {"negative_weight": 0.5}  # the misspelt option is gone, not kept beside the fix
    assert second.curate.reward_clip == 2.0 and second.generate.sampling.temperature == 0.5
    (run / "round-002" / "samples").mkdir()  # round 2 begun, then the run is resumed with rounds lowered (the config file's)
    with pytest.raises(UserError, match="has begun round 2; rounds 1 would drop it"):
        reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 1}), apply_from_next_round=True, write=False)


def test_each_round_is_evaluated_by_its_own_eval_every(tmp_path):
    """eval_every lowered from 2 to 1 with --apply-from-next-round evaluated round 1 again, an old policy; raised, it
    dropped the eval of the round in progress."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline

    run = tmp_path / "run"
    _recorded_run(run, 2, **{"eval_every": 2})
    cfg = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 4, "eval_every": 1})
    evals = [s.key for s in Pipeline(cfg).steps() if s.key.endswith("/eval")]
    assert evals == ["round-000/eval", "round-002/eval", "round-003/eval", "round-004/eval"]


def test_a_pipeline_refuses_generate_num_shards_and_resumes_past_an_unreadable_state(tmp_path):
    """generate.num_shards 2 in a pipeline config: each round generated half its prompts, was recorded finished, and
    score refused it on every rerun. A state.json damaged from outside stopped the resume with a traceback."""
    from toprcli.config import ConfigError, IterateConfig, load_config
    from toprcli.pipeline import State

    with pytest.raises(ConfigError, match="generate.num_shards is set in a pipeline config .* generate.data_parallel_size"):
        load_config(IterateConfig, None, sets={"generate.num_shards": 2})
    (tmp_path / "state.json").write_text("")
    with pytest.warns(UserWarning, match="state.json is unreadable"):
        assert State(tmp_path).data == {"steps": {}}


def test_a_warm_start_stopped_before_its_output_takes_a_changed_warm_start(tmp_path):
    """Killed while the warm start read its gold solutions (only base/ built): warm_start.enabled false was refused as
    "the completed rounds were made with the old value", and so was the fix the warm start's own error advised."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    sets = {"run_dir": str(run), "warm_start.enabled": True, "warm_start.init_model": True}
    reconcile(run.mkdir() or run, load_config(IterateConfig, None, sets=sets), apply_from_next_round=False)
    (run / "base").mkdir()
    assert reconcile(run, load_config(IterateConfig, None, sets={**sets, "warm_start.enabled": False}), apply_from_next_round=True) == ["warm_start.enabled"]
    with pytest.raises(UserError, match=r"warm_start.model_seed \(the starting policy\) cannot change — what the run made"):
        reconcile(run, load_config(IterateConfig, None, sets={**sets, "warm_start.model_seed": 3}), apply_from_next_round=True)
    (run / "warmstart").mkdir()  # its gold solutions read with the old settings
    with pytest.raises(UserError, match=r"warm_start.examples \(the starting policy\) cannot change"):
        reconcile(run, load_config(IterateConfig, None, sets={**sets, "warm_start.examples": 10}), apply_from_next_round=True)


@pytest.mark.parametrize("key, value, message", [
    ("train.loss_options", {"negativ_weight": 0.5}, "option 'negativ_weight' does not apply to loss 'topr'"),
    ("score.verifier", "regex:(unclosed", "regex"),
])
def test_loss_options_and_verifier_specs_are_checked_before_any_round(tmp_path, key, value, message):
    """`config check` said ok and iterate ran round 0's eval and round 1's generation before the first use failed; the
    run dir then refused the fix (a frozen verifier, or a recorded round)."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.pipeline import Pipeline

    section, leaf = key.split(".")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": "x", section: {leaf: value}}))
    r = CliRunner().invoke(app, ["config", "check", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2 and message in r.output
    cfg = load_config(IterateConfig, tmp_path / "c.yaml", sets={"run_dir": str(tmp_path / "run")})
    with pytest.raises(UserError, match=message):
        Pipeline(cfg).prepare()
    assert not (tmp_path / "run").exists()


def test_a_change_that_holds_only_in_part_leaves_the_round_in_progress_as_recorded(tmp_path):
    """train.loss dpo with curate.pairs matched, curate begun: round 1 took the loss and not the pairs, a config every
    later invocation refused ('train.loss dpo trains on preference pairs but curate.pairs is none')."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline
    from toprcli.runs import reconcile, round_config

    run = tmp_path / "run"
    _recorded_run(run, 1)
    (run / "round-001" / "policy" / "config.json").unlink()
    (run / "round-001" / "policy").rmdir()
    (run / "round-001" / "train.parquet").write_text("curated with the old settings")
    new = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 2, "train.loss": "dpo", "curate.pairs": "matched"})
    with pytest.warns(UserWarning, match="round 1 keeps its recorded settings \\(the change applies from round 2\\)"):
        reconcile(run, new, apply_from_next_round=True)
    assert round_config(run, 1).train.loss == "topr"
    assert [s.key for s in Pipeline(new).steps()][-2:] == ["round-002/train", "round-002/eval"]  # every round config loads


def test_the_trackers_log_each_round_when_its_own_eval_every_says_it_ends(tmp_path, monkeypatch):
    """Rounds recorded with eval_every 2, the config now 1: round 1 (no eval) waited for an eval step to be logged."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline

    run = tmp_path / "run"
    _recorded_run(run, 2, **{"eval_every": 2})
    (run / "round-002" / "config.yaml").write_text((run / "round-001" / "config.yaml").read_text())
    pipeline = Pipeline(load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 2, "eval_every": 1}))
    logged = []
    monkeypatch.setattr("toprcli.run_tracking.log_round", lambda tracker, run_dir, r, *a: logged.append(r))
    monkeypatch.setattr("toprcli.pipeline.round_summary", lambda run_dir, r: {})
    monkeypatch.setattr("toprcli.run_tracking.log_training", lambda *a: None)
    pipeline.tracker = object()
    pipeline.state = type("State", (), {"data": {"steps": {}}})()
    for step in pipeline.steps():
        pipeline._track(step.key)
    assert logged == [0, 1, 2]


def test_round_0_takes_an_eval_change_until_its_eval_begins(tmp_path):
    """Round 0 (the warm start, then its eval) never took --apply-from-next-round: a mistyped eval setting that failed
    round 0's eval failed it again on every rerun. It takes eval keys now; the warm start keeps its train settings."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.runs import reconcile, round_config

    run = tmp_path / "run"
    _recorded_run(run, 1)
    shutil.rmtree(run / "round-001" / "policy")  # round 1 recorded, not begun; the warm start done, round 0's eval failed
    (run / "warmstart").mkdir()
    (run / "round-000").mkdir()
    shutil.copy(run / "round-001" / "config.yaml", run / "round-000" / "config.yaml")
    fixed = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 1, "eval.k": 3, "train.lr": 1e-4})
    reconcile(run, fixed, apply_from_next_round=True)
    zero = round_config(run, 0)
    assert zero.eval.k == 3 and zero.train.lr == IterateConfig().train.lr  # the warm start's train base is as it began
    (run / "round-000" / "eval").mkdir()  # its eval begun: a later change waits for the next round
    reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 1, "eval.k": 5}), apply_from_next_round=True)
    assert round_config(run, 0).eval.k == 3


def test_round_0_judges_with_the_verifier_settings_it_was_given_before_its_eval(tmp_path):
    """Killed in the warm start, rerun with score.strict changed: round 0's eval judged with the new verifier and the old
    strict (its record took eval keys only), rounds 1+ with the new one, and the report compared them."""
    from toprcli.config import IterateConfig, config_to_dict, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile, round_config

    run = tmp_path / "run"
    sets = {"run_dir": str(run), "rounds": 2}
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(load_config(IterateConfig, None, sets=sets))))
    (run / "warmstart").mkdir()
    (run / "round-000").mkdir()
    shutil.copy(run / "config.yaml", run / "round-000" / "config.yaml")
    reconcile(run, load_config(IterateConfig, None, sets={**sets, "score.strict": True}), apply_from_next_round=True)
    assert round_config(run, 0).score.strict is True
    (run / "round-000" / "eval").mkdir()  # its eval begun, judged with it: the verifier is the run's from now on
    with pytest.raises(UserError, match=r"score.strict \(the verifier\) cannot change"):
        reconcile(run, load_config(IterateConfig, None, sets={**sets, "score.strict": False}), apply_from_next_round=True)


def test_a_recorded_config_the_schema_refuses_is_named_with_its_file(tmp_path):
    """A stale key in RUN/config.yaml said 'unknown config key' as if it were in the user's --config."""
    from toprcli.config import ConfigError, IterateConfig, config_to_dict
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({**config_to_dict(IterateConfig(run_dir=str(run))), "foo_removed": 1}))
    with pytest.raises(ConfigError, match=r"run/config.yaml \(the run's record\): unknown config key: 'foo_removed'"):
        reconcile(run, IterateConfig(run_dir=str(run)), apply_from_next_round=False)


def test_the_warm_starts_own_memory_settings_apply_at_once(tmp_path):
    """warm_start.train.micro_batch_tokens was frozen with the warm start ('cannot change'): a warm start that ran out of
    memory could not be rerun with less, and lowering train.micro_batch_tokens left the warm start's override in place."""
    from toprcli.config import IterateConfig, config_to_dict, load_config
    from toprcli.pipeline import Pipeline
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    sets = {"run_dir": str(run), "rounds": 1, "warm_start.enabled": True, "warm_start.train": {"micro_batch_tokens": 65536, "lr": 1e-3}}
    cfg = load_config(IterateConfig, None, sets=sets)
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    (run / "warmstart").mkdir()
    (run / "round-000").mkdir()
    (run / "round-000" / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    less = load_config(IterateConfig, None, sets={**sets, "warm_start.train": {"micro_batch_tokens": 4096, "lr": 1e-3}})
    assert reconcile(run, less, apply_from_next_round=False) == ["warm_start.train.micro_batch_tokens"]
    assert Pipeline(less).round_cfg(0).warm_start_train().micro_batch_tokens == 4096
    with pytest.raises(Exception, match=r"warm_start.train.lr \(the starting policy\) cannot change — .* start a new --run-dir$"):
        reconcile(run, load_config(IterateConfig, None, sets={**sets, "warm_start.train": {"micro_batch_tokens": 4096, "lr": 1e-2}}),
                  apply_from_next_round=True, write=False)


def test_a_branch_checks_the_sampling_of_the_rounds_it_replays(tmp_path):
    """Extending a run with replay_rounds over rounds of two temperatures is refused up front; a branch was not, and
    its first round's curate failed after generating and scoring."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import branch

    parent = tmp_path / "parent"
    _recorded_run(parent, 2, **{"generate.sampling.temperature": 0.8})
    child = load_config(IterateConfig, None, sets={"run_dir": str(tmp_path / "child"), "rounds": 3, "replay_rounds": 2})
    with pytest.raises(UserError, match="round 1 sampled with another generate.sampling.temperature"):
        branch(str(parent / "round-002"), tmp_path / "child", child)
    assert not (tmp_path / "child").exists()


def test_a_branch_does_not_need_the_parents_base_model(tmp_path):
    """A branch trains from its round's policy: a base model removed since (a purged scratch disk) refused it, and the
    model key cannot change, so nothing could."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.pipeline import Pipeline

    parent = tmp_path / "parent"
    _recorded_run(parent, 1)
    (parent / "round-001" / "eval").mkdir()
    cfg = load_config(IterateConfig, None, sets={"run_dir": str(tmp_path / "child"), "rounds": 2, "model": str(tmp_path / "gone")})
    for r in (parent / "config.yaml", parent / "round-001" / "config.yaml"):  # the parent ran with that model, as it was then
        r.write_text(yaml.safe_dump({**yaml.safe_load(r.read_text()), "model": str(tmp_path / "gone")}))
    assert Pipeline(cfg, branch_from=str(parent / "round-001")).prepare()["round"] == 1


def test_iterate_scores_with_the_datasets_verifier_and_records_what_auto_stood_for(tmp_path, tiny_model_dir):
    """score.verifier defaulted to gsm8k under iterate: a MATH dataset's \\frac golds were all 'error', every reward -1."""
    import yaml

    from toprcli.config import DatasetSpec, EvalConfig, GenerateConfig, IterateConfig, SamplingConfig, ScoreConfig
    from toprcli.errors import UserError
    from toprcli.pipeline import Pipeline

    rows = [{"problem": f"What is {k}/6 in lowest terms?", "solution": f"It is $\\boxed{{\\frac{{{k}}}{{6}}}}$."} for k in (1, 5, 7)]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "math-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    short = SamplingConfig(max_new_tokens=16)  # room in tiny's context of 512
    cfg = IterateConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir),
                        generate=GenerateConfig(dataset=DatasetSpec(source=str(tmp_path / "math.jsonl")), sampling=short),
                        eval=EvalConfig(dataset=DatasetSpec(source=str(tmp_path / "math-test.jsonl")), sampling=short))
    assert cfg.score.verifier == "auto"
    pipeline = Pipeline(cfg)
    pipeline.prepare()
    assert pipeline.verifier() == "math" and pipeline.cfg.score.verifier == "math"
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["score"]["verifier"] == "math"
    Pipeline(cfg).prepare()  # the same config again: auto stands for what the run recorded
    (tmp_path / "run" / "round-000").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / "round-001" / "samples").mkdir(parents=True)  # a round made with it: the verifier is frozen
    with pytest.raises(UserError, match=r"score.verifier \(the verifier\) cannot change"):
        Pipeline(IterateConfig(**{**cfg.__dict__, "score": ScoreConfig(verifier="gsm8k")})).prepare()
    record = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())  # as a run with `verifier: auto` was recorded before
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({**record, "score": {**record["score"], "verifier": "auto"}}))
    Pipeline(cfg).prepare()


def test_a_change_no_step_left_would_take_is_refused_not_recorded(tmp_path):
    """`--set train.lr=5e-3 --apply-from-next-round` on a run that had trained all its rounds ran nothing and exited 0,
    yet its config.yaml said lr 5e-3 from then on, and `report` labelled the run with it."""
    from toprcli.config import IterateConfig, load_config
    from toprcli.errors import UserError
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    _recorded_run(run, 2)
    before = (run / "config.yaml").read_text()
    with pytest.raises(UserError, match=r"has begun all its 2 rounds: train.lr would apply to no step left — extend it \(--rounds 3"):
        reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 2, "train.lr": 5e-3}), apply_from_next_round=True)
    assert (run / "config.yaml").read_text() == before
    # Round 2's eval has not begun: an eval change still has a step to take it; so has an extension.
    assert reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 2, "eval.k": 3}), apply_from_next_round=True) == ["eval.k"]
    assert reconcile(run, load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 3, "eval.k": 3, "train.lr": 5e-3}),
                     apply_from_next_round=True) == ["rounds", "train.lr"]


def test_off_a_terminal_each_round_prints_its_own_row(tmp_path):
    """Piped to a log, iterate printed nothing until the end; then every round printed the whole table again (N²/2 rows
    in an N-round log). Each round's row is printed when the round ends."""
    config = tmp_path / "micro.yaml"
    config.write_text(MICRO.format(run_dir=tmp_path / "run"))
    r = CliRunner().invoke(app, ["iterate", "-c", str(config), "--no-report", "--rounds", "2"])
    assert r.exit_code == 0, r.output
    tables = r.stdout.split("after round ")[1:]
    assert [t.split()[0] for t in tables] == ["0", "1", "2"]
    rows = [[line.split("│")[1].strip() for line in t.split("└")[0].splitlines() if line.startswith("│")] for t in tables]
    assert rows == [["0"], ["1"], ["2"]]


def test_a_branch_without_a_config_starts_from_the_settings_its_round_ran_with(one_round, tmp_path):
    """`--branch-from RUN/round-001 --set train.lr=...` without -c ran the demo's settings and was refused on four keys
    that differ from the parent's; it takes the round's own config, changed only where --set says."""
    _, parent = one_round
    child = tmp_path / "child"
    r = CliRunner().invoke(app, ["iterate", "--run-dir", str(child), "--rounds", "2", "--set", "train.lr=5e-4", "--no-report",
                                 "--no-progress", "--branch-from", str(parent / "round-001")])
    assert r.exit_code == 0 and "the branch starts from" in r.stderr, r.output
    assert json.loads((child / "lineage.json").read_text())["changed"] == ["train.lr"]
