"""A run's relative paths keep naming the files it started with, whichever directory it is rerun from."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from toprcli.config import IterateConfig, load_config
from toprcli.errors import UserError
from toprcli.run_paths import PATHS_FILE, check_paths, record_paths


def _cfg() -> IterateConfig:
    return IterateConfig(model="models/tiny", run_dir="runs/a")


@pytest.fixture
def two_projects(tmp_path, monkeypatch):
    """proj/ and other/, each with a models/tiny of its own; the run lives in proj/runs/a."""
    for project in ("proj", "other"):
        (tmp_path / project / "models" / "tiny").mkdir(parents=True)
    run = tmp_path / "proj" / "runs" / "a"
    run.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "proj")
    record_paths(run, check_paths(run, _cfg()))
    return tmp_path, run


def test_the_first_invocation_records_where_each_relative_path_pointed(two_projects):
    root, run = two_projects
    record = json.loads((run / PATHS_FILE).read_text())
    assert record == {"cwd": str(root / "proj"), "paths": {"model": {"words": "models/tiny", "path": str(root / "proj" / "models" / "tiny"),
                                                                     "from_run": "../../models/tiny"}}}
    record_paths(run, check_paths(run, _cfg()))  # rerun from the same place: accepted, nothing new
    assert json.loads((run / PATHS_FILE).read_text()) == record


def test_a_rerun_where_the_same_words_name_other_files_is_refused(two_projects, monkeypatch):
    root, run = two_projects
    monkeypatch.chdir(root / "other")  # `topr iterate --run-dir ../proj/runs/a`: models/tiny is other/'s model
    with pytest.raises(UserError, match=rf"model: models/tiny names {root}/other/models/tiny from here, but this run started "
                                        rf"with {root}/proj/models/tiny — run it from {root}/proj \(cd {root}/proj && topr iterate --run-dir {run}\)"):
        check_paths(run, _cfg())
    os.chdir(root)  # from where the words name nothing: the same refusal, not a hub id looked up
    with pytest.raises(UserError, match="models/tiny does not exist from here"):
        check_paths(run, _cfg())


def test_a_project_that_moved_with_its_files_goes_on_from_the_new_place(two_projects, monkeypatch):
    root, run = two_projects
    (root / "proj").rename(root / "moved")
    monkeypatch.chdir(root / "moved")
    run = root / "moved" / "runs" / "a"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # where it lay beside the run, it lies beside it still: nothing to say
        record = check_paths(run, _cfg())
    record_paths(run, record)
    assert json.loads((run / PATHS_FILE).read_text())["paths"]["model"]["path"] == str(root / "moved" / "models" / "tiny")


def test_a_copy_of_the_whole_project_goes_on_with_its_own_files(two_projects, monkeypatch):
    """`cp -a proj proj2` and the run continued in proj2 was refused: the original's files still exist."""
    import shutil

    root, run = two_projects
    shutil.copytree(root / "proj", root / "proj2", symlinks=True)
    monkeypatch.chdir(root / "proj2")
    record = check_paths(root / "proj2" / "runs" / "a", _cfg())
    assert record["paths"]["model"]["path"] == str(root / "proj2" / "models" / "tiny") and record["cwd"] == str(root / "proj2")


def test_names_hub_ids_and_absolute_paths_are_not_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.jsonl").write_text("{}\n")
    (tmp_path / "plug.py").write_text("")
    cfg = load_config(IterateConfig, None, {"model": "org/hub-model", "generate.dataset.source": "data/t.jsonl",
                                            "score.verifier": "python:plug.py:score", "eval.dataset.source": str(tmp_path / "data" / "t.jsonl")})
    record = check_paths(tmp_path, cfg)
    assert record["paths"] == {"generate.dataset.source": {"words": "data/t.jsonl", "path": str(tmp_path / "data" / "t.jsonl"), "from_run": "data/t.jsonl"},
                               "score.verifier": {"words": "plug.py", "path": str(tmp_path / "plug.py"), "from_run": "plug.py"}}
    (tmp_path / "train").mkdir()  # a folder named like a split, or a verifier: names, not paths
    (tmp_path / "gsm8k").mkdir()
    named = load_config(IterateConfig, None, {"score.verifier": "gsm8k", "generate.dataset.few_shot_split": "train"})
    assert check_paths(tmp_path, named)["paths"] == {}



def test_a_hand_edited_run_config_is_checked_against_topr_s_record(tmp_path):
    """Editing RUN/config.yaml (train.loss, the training data) and rerunning with --run-dir alone bypassed every guard:
    the file was compared with itself. topr's own copy is the record it is checked against, as a -c would be."""
    import yaml

    from toprcli.config import config_to_dict, load_config
    from toprcli.run_paths import keep_recorded_copy, recorded_copy
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    cfg = IterateConfig(run_dir=str(run), model="m", rounds=2)
    reconcile(run, cfg, apply_from_next_round=False)  # the first invocation records it
    keep_recorded_copy(run, cfg, None)
    (run / "round-001" / "samples").mkdir(parents=True)  # work made with it
    (run / "round-001" / "samples" / "shard-00000.parquet").write_bytes(b"x")
    assert recorded_copy(run) is None  # untouched
    edited = config_to_dict(cfg)
    edited["train"]["loss"] = "sft"
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    now = load_config(IterateConfig, run / "config.yaml")  # `topr iterate --run-dir RUN` reads the edited file
    assert reconcile(run, now, apply_from_next_round=False, write=False) == []  # compared with itself: no change seen
    with pytest.raises(UserError, match=r"started with a different config \(changed: train.loss\)"):
        reconcile(run, now, apply_from_next_round=False, recorded_file=recorded_copy(run))
    assert reconcile(run, now, apply_from_next_round=True, recorded_file=recorded_copy(run)) == ["train.loss"]
    keep_recorded_copy(run, now, recorded_copy(run))
    assert recorded_copy(run) is None and "sft" in (run / ".recorded-config.yaml").read_text()
    # Edited again, then run with the original -c (no change against the record): the edit must not become the record
    (run / "config.yaml").write_text(yaml.safe_dump({**config_to_dict(now), "rounds": 2, "train": {**config_to_dict(now)["train"], "loss": "dpo"}}))
    assert reconcile(run, now, apply_from_next_round=False, recorded_file=recorded_copy(run)) == []
    with pytest.warns(UserWarning, match="had been edited by hand"):
        keep_recorded_copy(run, now, recorded_copy(run))
    assert "dpo" not in (run / "config.yaml").read_text() and recorded_copy(run) is None


def test_a_run_dir_reached_through_a_symlink_is_where_it_lies(tmp_path, monkeypatch):
    """Two checkouts each with `r -> /real/runs` and a models/tiny of their own: the run begun in p1 was taken in p2
    (`--run-dir r/a`) with p2's model, since the run dir's position was the symlink's."""
    (tmp_path / "real" / "runs" / "a").mkdir(parents=True)
    for checkout in ("p1", "p2"):
        (tmp_path / checkout / "models" / "tiny").mkdir(parents=True)
        (tmp_path / checkout / "r").symlink_to(tmp_path / "real" / "runs")
    monkeypatch.chdir(tmp_path / "p1")
    record_paths(tmp_path / "p1" / "r" / "a", check_paths(Path("r/a"), _cfg()))
    monkeypatch.chdir(tmp_path / "p2")
    with pytest.raises(UserError, match=rf"names {tmp_path}/p2/models/tiny from here, but this run started with {tmp_path}/p1/models/tiny"):
        check_paths(Path("r/a"), _cfg())
    # A launch that made nothing (refused, or failed at once, from the wrong place) does not pin: the next one is taken.
    assert check_paths(Path("r/a"), _cfg(), pinned=False)["paths"]["model"]["path"] == str(tmp_path / "p2" / "models" / "tiny")


def test_a_new_branch_is_held_to_the_files_its_parent_s_rounds_were_made_with(two_projects, monkeypatch):
    """`topr iterate --branch-from ../proj/runs/a/round-001 --run-dir b` from other/: the branch inherited round 1 (made
    with proj's model) and went on with other/'s models/tiny, as the parent's words now named it there."""
    import yaml

    from toprcli.config import config_to_dict, load_config
    from toprcli.pipeline import Pipeline

    root, run = two_projects
    cfg = load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": 1, "model": "models/tiny"})
    for record in (run / "config.yaml", run / "round-001" / "config.yaml"):
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(yaml.safe_dump(config_to_dict(cfg)))
    (run / "round-001" / "policy").mkdir()
    (run / "round-001" / "policy" / "config.json").write_text("{}")
    branch = load_config(IterateConfig, run / "config.yaml", sets={"run_dir": str(root / "other" / "runs" / "b"), "rounds": 2})
    monkeypatch.chdir(root / "other")
    with pytest.raises(UserError, match=rf"model: models/tiny names {root}/other/models/tiny from here, but the run it branches from "
                                        rf"\({run}\) used {root}/proj/models/tiny — run it from {root}/proj"):
        Pipeline(branch, branch_from=str(run / "round-001")).prepare()
    assert not (root / "other" / "runs" / "b" / "lineage.json").exists()  # at the parent's depth: ../../models/tiny from both
    monkeypatch.chdir(root / "proj")  # from where the parent ran: branched, and its record is the parent's
    Pipeline(branch, branch_from=str(run / "round-001")).prepare()
    made = root / "other" / "runs" / "b"
    assert json.loads((made / PATHS_FILE).read_text())["paths"]["model"]["path"] == str(root / "proj" / "models" / "tiny")
    assert json.loads((made / PATHS_FILE).read_text())["paths"]["model"]["from_run"] == "../../../proj/models/tiny"  # from its own dir
    # Killed after the branch was made, before its paths were recorded, then resumed with --run-dir alone: still the parent's.
    (made / PATHS_FILE).unlink()
    monkeypatch.chdir(root / "other")
    with pytest.raises(UserError, match="but the run it branches from"):
        Pipeline(load_config(IterateConfig, made / "config.yaml")).prepare()


def test_a_launch_killed_between_the_run_config_and_topr_s_copy_is_no_hand_edit(tmp_path):
    """reconcile rewrote config.yaml, then a kill came before topr's copy was written: the next launch (no -c) took its
    own write for a hand edit, asked for --apply-from-next-round and said the file had been edited."""
    from toprcli.config import config_to_dict, config_yaml, load_config
    from toprcli.run_paths import keep_recorded_copy, recorded_copy, recording
    from toprcli.runs import reconcile

    run = tmp_path / "run"
    cfg = IterateConfig(run_dir=str(run), model="m", rounds=2)
    reconcile(run, cfg, apply_from_next_round=False)
    keep_recorded_copy(run, cfg, None)
    (run / "round-001" / "samples").mkdir(parents=True)
    (run / "round-001" / "samples" / "shard-00000.parquet").write_bytes(b"x")
    changed = load_config(IterateConfig, None, sets={**{k: v for k, v in config_to_dict(cfg).items() if k in ("run_dir", "model", "rounds")},
                                                     "train.lr": 3e-6})
    edited = recorded_copy(run)  # the launch with -c changed.yaml --apply-from-next-round, as Pipeline.prepare goes ...
    with recording(run, changed):
        assert reconcile(run, changed, apply_from_next_round=True, recorded_file=edited) == ["train.lr"]
    # ... killed here, before keep_recorded_copy. The next launch goes on with the run's config.yaml:
    assert recorded_copy(run) is None
    assert reconcile(run, load_config(IterateConfig, run / "config.yaml"), apply_from_next_round=False) == []
    assert "lr: 3.0e-06" in (run / ".recorded-config.yaml").read_text() and not (run / ".recorded-config.yaml.pending").exists()
    # A pending copy of a launch killed before config.yaml changed is dropped, and a real edit is still seen as one.
    (run / ".recorded-config.yaml.pending").write_text(config_yaml(cfg))
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("3.0e-06", "1.0e-05"))
    assert recorded_copy(run) == run / ".recorded-config.yaml" and not (run / ".recorded-config.yaml.pending").exists()
    # That edit, refused, and the same launch again: refused again (its bytes were pended as topr's own, and taken).
    from toprcli.pipeline import Pipeline

    for _ in range(2):
        with pytest.raises(UserError, match="started with a different config .* was edited since topr recorded it"):
            Pipeline(load_config(IterateConfig, run / "config.yaml")).prepare()
    assert recorded_copy(run) == run / ".recorded-config.yaml"
    # Accepted (--apply-from-next-round), killed after reconcile rewrote config.yaml: the next launch takes it as topr's.
    import toprcli.run_paths as run_paths

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    edited_cfg = load_config(IterateConfig, run / "config.yaml")
    original, run_paths.keep_recorded_copy = run_paths.keep_recorded_copy, killed
    try:
        with pytest.raises(KeyboardInterrupt):
            Pipeline(edited_cfg, apply_from_next_round=True).prepare()
    finally:
        run_paths.keep_recorded_copy = original
    assert recorded_copy(run) is None and "lr: 1.0e-05" in (run / ".recorded-config.yaml").read_text()
