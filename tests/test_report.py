"""report.py: one run's rounds, as tables, plots and summary.md."""

from __future__ import annotations

import json
from pathlib import Path

from toprcli.config import config_to_dict


def test_error_bars_of_an_interval_that_misses_its_point_are_drawn(tmp_path):
    """A percentile interval from few resamples need not contain the mean; matplotlib refused the negative bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toprcli.report import plot_series

    fig, ax = plt.subplots()
    plot_series(ax, [{"round": 0, "pass@1": 0.375, "intervals": {"pass@1": [0.125, 0.125]}}, {"round": 1, "pass@1": 0.5}], "pass@1", "pass@1")
    (line,) = ax.get_lines()[:1]
    assert list(line.get_ydata()) == [0.375, 0.5]
    plt.close(fig)


def test_a_point_and_its_interval_print_at_one_precision():
    """0.0625 printed as 0.0625 [0.062, 0.062] sat outside its own interval."""
    from toprcli.report import with_interval

    assert with_interval({"pass@1": 0.0625, "intervals": {"pass@1": [0.0625, 0.0625]}}, "pass@1", digits=3) == "0.062 [0.062, 0.062]"



def test_collect_reads_round_configs_through_the_schema_and_only_finished_scores(tmp_path):
    """A round recorded by an older toprcli (a key added since) or with other eval workers changed nothing the eval
    measures (both made later rounds 'not comparable'); a round still being scored has no reward numbers yet (a part
    was shown as the round's); a user's round-001.bak is no round (its name crashed every report and reconcile)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from toprcli import shards
    from toprcli.config import IterateConfig
    from toprcli.compare import label
    from toprcli.report import collect
    from toprcli.runs import round_dirs, trained_rounds

    run, full = tmp_path / "run", config_to_dict(IterateConfig())
    old = json.loads(json.dumps(full))
    del old["eval"]["bootstrap_seed"]
    for r, cfg in enumerate([old, {**full, "eval": {**full["eval"], "workers": 3}}, full]):
        (run / f"round-{r:03d}" / "scored").mkdir(parents=True)
        (run / f"round-{r:03d}" / "config.yaml").write_text(yaml.safe_dump(cfg))
        pq.write_table(pa.table({"reward": [1.0, -1.0], "verdict": ["correct", "incorrect"]}), run / f"round-{r:03d}" / "scored" / "shard-00000.parquet")
    for r in (0, 2):
        shards.write_manifest(run / f"round-{r:03d}" / "scored", stage="score", config={})
    for junk in ("round-001.bak", "round-009-old"):
        (run / junk / "policy").mkdir(parents=True)
        (run / junk / "policy" / "config.json").write_text("{}")
    assert list(round_dirs(run)) == [0, 1, 2] and trained_rounds(run) == 0
    rows = collect(run)
    assert [r["round"] for r in rows] == [0, 1, 2] and [r["eval_comparable"] for r in rows] == [True] * 3
    assert rows[1]["config_changed"] == [] and "reward_mean" not in rows[1] and rows[2]["reward_mean"] == 0.0  # workers: how it ran
    changed = {**full, "train": {**full["train"], "lr": 1e-6}, "tracking": {**full["tracking"], "run_name": "x"}}
    assert label(["run"], changed, full, rows)[0] == "run (train.lr=1e-06)"  # a sweep's tracked names are not what differs
    # A run written before a key existed is labelled by what differs, not by the key it lacks ('rerun (eval.bootstrap_seed=None)').
    from toprcli.report import recorded_config

    (run / "config.yaml").write_text(yaml.safe_dump(old))
    assert label(["run"], recorded_config(run), full, rows)[0] == "run"


def test_the_headline_compares_only_rounds_evaluated_alike():
    """Round 3 evaluated with another k: the report said so, then quoted "pass@1 went from round 0 to round 3"."""
    from toprcli.report import markdown

    rows = [{"round": 0, "pass@1": 0.2}, {"round": 1, "pass@1": 0.3}, {"round": 3, "pass@1": 0.5, "eval_comparable": False}]
    text = markdown(rows, Path("runs/x"))
    assert "pass@1 went from 20.0% (round 0) to 30.0% (round 1): +10.0 points." in text and "(round 3):" not in text


def test_summary_names_k_and_says_which_rounds_had_checks_that_failed(tmp_path):
    """summary.md headed its columns maj@k and pass@k with no k, and a round whose checks failed (counted wrong) was
    reported as if the policy had got those samples wrong: eval warned, report and iterate dropped it."""
    from toprcli import shards
    from toprcli.report import markdown
    from toprcli.runs import round_summary

    ev = tmp_path / "run" / "round-000" / "eval"
    ev.mkdir(parents=True)
    shards.write_json_atomic(ev / "eval.json", {"k": 8, "metrics": {"pass@1": 0.5, "maj@k": 0.6, "pass@k": 0.9, "invalid_rate": 0.0,
                                                                  "error_rate": 0.25, "greedy_error_rate": 0.0, "truncated_rate": 0.1}})
    row = round_summary(tmp_path / "run", 0)
    assert row["error_rate"] == 0.25 and row["truncated_rate"] == 0.1
    text = markdown([row, {"round": 1, "pass@1": 0.7, "k": 8}], Path("runs/x"))
    assert "| maj@8 | pass@8 |" in text and "Round 0: 25.0% of the samples and 0.0% of the greedy completions could not be checked" in text
    assert "Round 1:" not in text and "| maj@k |" in markdown([row, {"round": 1, "k": 4}], Path("runs/x"))
    # A round with no trained policy yet (killed, or running) is said to be unfinished; a trained one is not, nor round 0 (the base).
    assert "Round 1 is not finished" in text and "Round 0 is not finished" not in text
    assert "not finished" not in markdown([{"round": 1, "train_steps": 4}], Path("runs/x"))


def test_a_damaged_file_in_a_run_is_one_line_naming_it_and_nothing_is_written(tmp_path):
    """A foreign or edited eval.json, train_summary.json or round config was a traceback; a metrics.jsonl cut short by
    a kill stopped the report after three of its plots."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from toprcli.cli.main import app

    run = tmp_path / "run"
    (run / "round-000" / "eval").mkdir(parents=True)
    (run / "round-000" / "policy").mkdir()
    (run / "round-000" / "policy" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    ok = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert ok.exit_code == 0, ok.output  # the cut line skipped
    for name, text, said in [("eval/eval.json", '{"metrics": ', "is not valid JSON"), ("eval/eval.json", '{"k": 1}', "has no 'metrics'"),
                             ("policy/train_summary.json", "[1,", "is not valid JSON"), ("config.yaml", "a: [", "is not valid YAML")]:
        path = run / "round-000" / name
        path.write_text(text)
        (run / "report").exists() and __import__("shutil").rmtree(run / "report")
        r = CliRunner().invoke(app, ["report", str(run)])
        assert r.exit_code == 2 and said in r.output and "round-000" in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not (run / "report").exists()
        path.unlink()
    (run / "round-000" / "scored").mkdir()
    pq.write_table(pa.table({"x": [1]}), run / "round-000" / "scored" / "shard-00000.parquet")
    (run / "round-000" / "scored" / "_manifest.json").write_text("{}")
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and "no column 'reward'" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_report_writes_where_out_says_and_refuses_a_run_given_twice(tmp_path):
    """`report RUN --out DIR` wrote RUN/report and said nothing; `report run run --out c` compared a run with itself."""
    from typer.testing import CliRunner

    from toprcli.cli.main import app

    run = tmp_path / "run"
    (run / "round-000").mkdir(parents=True)
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "elsewhere")])
    assert r.exit_code == 0 and (tmp_path / "elsewhere" / "summary.md").is_file() and not (run / "report").exists(), r.output
    r = CliRunner().invoke(app, ["report", str(run), f"{run}/", "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "a run is given twice" in r.output and not (tmp_path / "c").exists()


def test_rounds_losses_follow_one_another_and_other_eval_settings_are_drawn_apart(tmp_path, monkeypatch):
    """loss.png drew every round at steps 1..n on top of one another, beside the warm start's supervised loss 100× larger;
    accuracy.png joined a round evaluated with another k to the rounds before it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure
    import matplotlib.pyplot as plt

    from toprcli.report import _loss_plot, plot_series

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    _loss_plot({"warmstart": [(1, 4.0), (2, 3.0)], "round-001": [(1, 0.1), (2, 0.2)], "round-002": [(1, 0.3), (2, 0.4)]}, tmp_path / "loss.png")
    rounds, warm = drawn[0].axes
    assert [list(line.get_xdata()) for line in rounds.get_lines()] == [[1, 2], [3, 4]] and list(warm.get_lines()[0].get_ydata()) == [4.0, 3.0]
    fig, ax = plt.subplots()
    plot_series(ax, [{"round": 0, "pass@1": 0.2}, {"round": 1, "pass@1": 0.3}, {"round": 2, "pass@1": 0.6, "eval_comparable": False}], "pass@1", "pass@1")
    joined, apart = ax.get_lines()[:2]
    assert list(joined.get_xdata()) == [0, 1] and list(apart.get_xdata()) == [2] and apart.get_linestyle() == "None"
    assert ax.get_legend_handles_labels()[1] == ["pass@1", "pass@1 (other eval settings)"]
    assert joined.get_color() == apart.get_color()  # a variant keeps its colour (the apart part took the next one)
    plt.close(fig)
