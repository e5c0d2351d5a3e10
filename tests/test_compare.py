"""compare.py: runs compared — what may be paired, seeds as one variant, the rounds compared, the labels."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from toprcli.cli.main import app
from toprcli.compare import comparison_markdown, paired_difference, run_names
from toprcli.config import EvalConfig, IterateConfig, SamplingConfig, config_to_dict


def _eval(path: Path, r: int, per_prompt: dict[str, float], **eval_settings) -> None:
    """Round ``r``'s eval.json: these per-prompt pass@1 scores (pass@1 their mean) under these eval settings."""
    path = path / f"round-{r:03d}" / "eval" / "eval.json"
    path.parent.mkdir(parents=True)
    mean = sum(per_prompt.values()) / len(per_prompt)
    metrics = {"pass@1": mean, "maj@k": mean, "pass@k": mean, "invalid_rate": 0.0, "bootstrap": {"resamples": 200, "seed": 0}}
    path.write_text(json.dumps({"iteration": r, "k": 4, "config": config_to_dict(EvalConfig(**eval_settings)), "per_prompt": {"pass@1": per_prompt},
                                "metrics": metrics}))


def _run(root: Path, name: str, per_prompt: dict[str, float], **eval_settings) -> Path:
    """A run dir whose round 1 eval.json holds these per-prompt pass@1 scores and eval settings."""
    _eval(root / name, 1, per_prompt, **eval_settings)
    return root / name


def _recorded(root: Path, name: str, scores: list[dict[str, float]], **sets) -> Path:
    """A run with a config (``sets``: dotted keys) and one evaluated round per entry of ``scores``."""
    from toprcli.config import load_config

    run = root / name
    run.mkdir(parents=True)
    cfg = config_to_dict(load_config(IterateConfig, None, sets={"run_dir": str(run), "rounds": len(scores) - 1, **sets}))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    for r, per_prompt in enumerate(scores):
        _eval(run, r, per_prompt)
        (run / f"round-{r:03d}" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def test_runs_evaluated_on_another_task_are_not_paired(tmp_path):
    """Same prompt ids, another k: the evals measure different things, so no paired difference 'within the noise'
    (they were paired by prompt id and labelled). Another sampling seed is the same task; so is a smaller limit of
    the same set (the pairs are the prompts both have)."""
    scores = {f"p{i}": i % 2 * 1.0 for i in range(10)}
    a = _run(tmp_path, "a", scores, k=4)
    b = _run(tmp_path, "b", {p: 1.0 for p in scores}, k=4, sampling=SamplingConfig(seed=7))
    c = _run(tmp_path, "c", scores, k=8)
    d = _run(tmp_path, "d", {p: 1.0 for p in list(scores)[:6]}, k=4)
    d_eval = json.loads((d / "round-001" / "eval" / "eval.json").read_text())
    d_eval["config"]["dataset"]["limit"] = 6
    (d / "round-001" / "eval" / "eval.json").write_text(json.dumps(d_eval))
    read = lambda run: [json.loads((run / "round-001" / "eval" / "eval.json").read_text())]  # noqa: E731
    same_task = paired_difference(read(a), read(b))
    assert same_task["pass@1"]["prompts"] == 10 and same_task["pass@1"]["difference"] == 0.5
    other = paired_difference(read(a), read(c))
    assert other["not_comparable"] == ["k"] and "pass@1" not in other
    assert paired_difference(read(a), read(d))["pass@1"]["prompts"] == 6
    groups = [{"label": "a", "runs": [str(a)], "round": 1, "rounds_evaluated": {"a": 1}, "differs": [], "final": {"round": 1}},
              {"label": "c", "runs": [str(c)], "round": 1, "rounds_evaluated": {"c": 1}, "differs": [], "final": {"round": 1}, "paired_vs_first": other}]
    assert "c and a were evaluated differently (k): no paired difference." in comparison_markdown(groups)


def test_runs_with_one_directory_name_are_told_apart(tmp_path):
    """Comparing a/demo with b/demo labelled both "demo", and the paired difference read "demo − demo"."""
    a, b = tmp_path / "a" / "demo", tmp_path / "b" / "demo"
    assert run_names([a, b]) == ["a/demo", "b/demo"]
    assert run_names([a, tmp_path / "other"]) == ["demo", "other"]


def test_seeds_are_one_variant_with_mean_and_std_and_pooled_pairs(tmp_path):
    """Four runs, two variants × two seeds: report showed four columns, each seed paired with the first run alone
    (a seed with its sibling); a variant is its seeds' mean ± standard deviation, paired on per-prompt seed means."""
    from toprcli.compare import write_comparison

    prompts = [f"p{i}" for i in range(8)]
    per = lambda hits: {p: float(i < hits) for i, p in enumerate(prompts)}  # noqa: E731
    runs = [_recorded(tmp_path, "topr-s0", [per(2), per(4)], **{"train.seed": 0}),
            _recorded(tmp_path, "topr-s1", [per(2), per(6)], **{"train.seed": 1, "generate.sampling.seed": 1}),
            _recorded(tmp_path, "sft-s0", [per(2), per(2)], **{"train.loss": "sft"}),
            _recorded(tmp_path, "sft-s1", [per(2), per(4)], **{"train.loss": "sft", "train.seed": 1, "score.workers": 3})]  # workers: how it ran
    compared, out = write_comparison(runs, tmp_path / "cmp")
    topr, sft = compared["variants"]
    assert topr["label"] == "topr-s0+topr-s1 (2 seeds)" and sft["label"] == "sft-s0+sft-s1 (train.loss=sft; 2 seeds)"
    assert topr["final"]["pass@1"] == 0.625 and abs(topr["final"]["seeds"]["pass@1"]["std"] - 0.1767767) < 1e-6
    paired = sft["paired_vs_first"]["pass@1"]  # per prompt: topr (0.5 .. ) vs sft; mean over 8 prompts of sft − topr
    assert paired["prompts"] == 8 and paired["difference"] == 0.375 - 0.625
    text = (out / "compare.md").read_text()
    assert "| pass@1 | 0.625 ± 0.177 | 0.375 ± 0.177 |" in text and "mean ± standard deviation over 2 seeds (topr-s0, topr-s1)" in text


def test_a_variant_is_compared_at_its_last_evaluated_round_and_labelled_with_what_its_rounds_ran(tmp_path):
    """A run killed in round 3 was shown at round 3 (pass@1 –) and paired at round 2; a change applied from round 2 on
    (--apply-from-next-round) was labelled as the run's setting. Runs compared at other rounds are said to be."""
    from toprcli.compare import write_comparison

    per = {f"p{i}": float(i < 3) for i in range(6)}
    base = _recorded(tmp_path, "base", [per, per, per, per])
    lr = _recorded(tmp_path, "lr", [per, per, per], **{"train.lr": 1e-4})
    (lr / "round-003").mkdir()  # begun, not evaluated
    changed = yaml.safe_load((lr / "round-002" / "config.yaml").read_text())
    changed["train"]["lr"] = 1e-3
    (lr / "config.yaml").write_text(yaml.safe_dump(changed))
    (lr / "round-002" / "config.yaml").write_text(yaml.safe_dump(changed))
    compared, out = write_comparison([base, lr], tmp_path / "cmp")
    first, second = compared["variants"]
    assert (first["round"], second["round"]) == (3, 2) and second["final"]["pass@1"] == 0.5
    assert second["label"] == "lr (train.lr=0.001 from round 2)"
    r = CliRunner().invoke(app, ["report", str(base), str(lr), "--out", str(tmp_path / "cmp2")])
    assert r.exit_code == 0 and "compared at their last evaluated rounds, which differ: base round 3, lr (train.lr=0.001 from round 2) round 2" in r.stdout
    assert "(paired bootstrap): within the noise." in r.stdout  # the notes were in compare.md alone


def test_a_branch_is_labelled_by_what_differs_not_from_the_round_it_began(tmp_path):
    """Branches of one round 0 with train.loss=sft were labelled 'train.loss=sft from round 1': their own first round."""
    from toprcli.compare import write_comparison

    per = {f"p{i}": float(i < 3) for i in range(6)}
    parent = _recorded(tmp_path, "parent", [per, per])
    branch = _recorded(tmp_path, "branch", [per, per], **{"train.loss": "sft"})
    zero = yaml.safe_load((parent / "round-000" / "config.yaml").read_text())
    (branch / "round-000" / "config.yaml").write_text(yaml.safe_dump(zero))  # round 0 is the parent's, as a branch links it
    (branch / "lineage.json").write_text(json.dumps({"parent": str(parent), "round": 0, "links": "hardlink", "changed": ["train.loss"]}))
    compared, _ = write_comparison([parent, branch], tmp_path / "cmp")
    assert compared["variants"][1]["label"] == "branch (train.loss=sft)"


def test_seeds_evaluated_at_different_rounds_are_compared_at_the_last_round_all_evaluated(tmp_path):
    """eval_every 2: seed 0 evaluated rounds 0, 2, 3 and seed 1 rounds 0, 2, 4: the variant was shown at round 3 (one
    seed's, pass@1 –) and its pairing, labelled 2 seeds, was one."""
    import shutil

    from toprcli.compare import write_comparison

    per = lambda hits: {f"p{i}": float(i < hits) for i in range(4)}  # noqa: E731
    s0 = _recorded(tmp_path, "s0", [per(1), per(2), per(2), per(3)], **{"train.seed": 0})
    s1 = _recorded(tmp_path, "s1", [per(1), per(2), per(4), per(4), per(4)], **{"train.seed": 1})
    for run, r in ((s0, 1), (s1, 1), (s1, 3)):
        shutil.rmtree(run / f"round-{r:03d}" / "eval")
    other = _recorded(tmp_path, "other", [per(1), per(1), per(1)], **{"train.loss": "sft"})
    compared, _ = write_comparison([s0, s1, other], tmp_path / "cmp")
    seeds = compared["variants"][0]
    assert seeds["round"] == 2 and seeds["final"]["pass@1"] == 0.75
    paired = compared["variants"][1]["paired_vs_first"]
    assert paired["rounds"] == [2, 2] and paired["pass@1"]["difference"] == 0.25 - 0.75


def test_the_first_run_is_labelled_with_what_it_changed_on_the_way(tmp_path):
    """The first run moved to another lr at round 2 and was labelled by its name alone, while the other run, which ran
    the first's old lr throughout, was labelled as the one with a different lr."""
    from toprcli.compare import write_comparison

    per = {f"p{i}": float(i < 3) for i in range(6)}
    grown = _recorded(tmp_path, "grown", [per, per, per], **{"train.lr": 1e-4})
    changed = yaml.safe_load((grown / "round-002" / "config.yaml").read_text())
    changed["train"]["lr"] = 1e-3
    (grown / "config.yaml").write_text(yaml.safe_dump(changed))
    (grown / "round-002" / "config.yaml").write_text(yaml.safe_dump(changed))
    other = _recorded(tmp_path, "other", [per, per, per], **{"train.lr": 1e-4})
    compared, _ = write_comparison([grown, other], tmp_path / "cmp")
    assert [v["label"] for v in compared["variants"]] == ["grown (train.lr=0.001 from round 2)", "other (train.lr=0.0001)"]


def _branch(parent: Path, run: Path, at: int) -> None:
    """Make ``run``'s rounds up to ``at`` its parent's, as `--branch-from parent/round-<at>` links them."""
    import shutil

    for r in range(at + 1):
        shutil.rmtree(run / f"round-{r:03d}")
        shutil.copytree(parent / f"round-{r:03d}", run / f"round-{r:03d}")
    (run / "lineage.json").write_text(json.dumps({"parent": str(parent), "round": at, "links": "hardlink", "changed": []}))


def test_a_branch_with_another_history_is_not_a_seed_and_shared_rounds_are_one_measurement(tmp_path):
    """sft-from1 ran one TOPR round before SFT: it was grouped as a second seed of sft-s0 (mean ± std, a paired test);
    the round 0 that seed branches share was shown as 4 seeds' 0.105 ± 0.000."""
    from toprcli.compare import write_comparison

    per = lambda hits: {f"p{i}": float(i < hits) for i in range(8)}  # noqa: E731
    topr = _recorded(tmp_path, "topr", [per(2), per(3), per(4)])
    sft = _recorded(tmp_path, "sft", [per(2), per(4), per(5)], **{"train.loss": "sft"})
    late = _recorded(tmp_path, "sft-from1", [per(2), per(3), per(6)], **{"train.loss": "sft", "train.seed": 1})
    seed = _recorded(tmp_path, "topr-s1", [per(2), per(5), per(6)], **{"train.seed": 1})
    _branch(topr, sft, 0), _branch(topr, late, 1), _branch(topr, seed, 0)
    compared, _ = write_comparison([topr, seed, sft, late], tmp_path / "cmp")
    labels = [v["label"] for v in compared["variants"]]
    assert labels == ["topr+topr-s1 (2 seeds)", "sft (train.loss=sft)", "sft-from1 (train.loss=sft from round 2)"]
    zero = compared["variants"][0]["series"][0]
    assert zero["round"] == 0 and zero["pass@1"] == 0.25 and "pass@1" not in zero["seeds"]  # one measurement: no spread
    assert compared["variants"][0]["final"]["seeds"]["pass@1"]["values"] == [0.5, 0.75]


def test_what_the_table_cannot_show_is_said(tmp_path):
    """A lagging seed, a repeat and fewer prompts are said; maj@k is named by its k."""
    import shutil

    from toprcli.compare import write_comparison

    per = lambda hits, n=8: {f"p{i}": float(i < hits) for i in range(n)}  # noqa: E731
    a = _recorded(tmp_path, "a", [per(2), per(4), per(5)])
    lag = _recorded(tmp_path, "lag", [per(2), per(3)], **{"train.seed": 1})
    shutil.rmtree(lag / "round-001" / "eval")  # killed before round 1's eval
    again = _recorded(tmp_path, "again", [per(2), per(4), per(5)])
    fewer = _recorded(tmp_path, "fewer", [per(2, 4), per(2, 4), per(3, 4)], **{"train.lr": 1e-4})
    compared, out = write_comparison([a, lag, again, fewer], tmp_path / "cmp")
    text = (out / "compare.md").read_text()
    assert "its runs were evaluated to different rounds (a 2, lag 0): compared at round 0" in text and "finish lag" in text
    assert "again has the settings of a, seeds included: a repeat" in text
    assert "fewer (train.lr=0.0001) was evaluated on 4 prompts and a+lag (2 seeds) on 8" in text
    assert "| maj@4 |" in text  # one k: named in the row


def test_p_tilde_is_what_the_round_s_loss_trains_on():
    """report, compare, iterate's table and the trackers showed curate's p̃ 0.5 for sft (it trains on positives only)."""
    from toprcli.runs import trained_share

    row = {"p": 0.2, "p_effective": 0.5}
    assert trained_share("topr", row) == {} and trained_share(None, row) == {}
    assert trained_share("sft", row) == {"p_effective": 1.0}  # negatives carry no gradient
    assert trained_share("dpo", row) == {"p_effective": None}  # pairs, not advantages
