"""`topr report`: per-round metrics of a run directory, as PNG plots and markdown.

Reads ``RUN_DIR/round-*/eval/eval.json``, ``round-*/train.parquet`` metadata,
``round-*/scored/`` rewards and verdicts, and ``*/policy/metrics.jsonl``.
Writes ``RUN_DIR/report/{accuracy,mix,rewards,loss}.png`` and
``RUN_DIR/report/summary.md``; each round says which settings changed from the round before
(``round-*/config.yaml``) and a branch names its parent (``lineage.json``). Several runs are
compared in ``compare.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from toprcli.config import IterateConfig, as_now, read_yaml
from toprcli.errors import UserError
from toprcli.runs import CONFIG_FILE, LINEAGE_FILE, round_dir, round_dirs, run_summary, setting_changes
from toprcli.shards import changed_keys, read_json, read_jsonl_records, read_manifest, read_table
from toprcli.stages.eval import HOW_IT_RUNS

VERDICT_COLORS = {"correct": "#2e7d32", "incorrect": "#c62828", "no_answer": "#9e9e9e", "timeout": "#6a1b9a", "error": "#ef6c00"}


def collect(run_dir: str | Path) -> list[dict[str, Any]]:
    """Per-round metrics: pass@1, maj@k, invalid rate, p, p̃, reward stats, training loss."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{'run dir not found' if not run_dir.exists() else 'not a run directory (a file)'}: {run_dir} — pass the --run-dir "
                        "of a `topr iterate` run")
    rows = run_summary(run_dir)
    if not rows:
        raise UserError(f"{run_dir} has no round-* directories — is it a `topr iterate` run dir?")
    configs: dict[int, dict] = {}
    for row in rows:
        row.update(_reward_stats(round_dir(run_dir, row["round"]) / "scored"))
        config = _round_config(run_dir, row["round"])
        if config is not None:
            configs[row["round"]] = config
            before = configs.get(row["round"] - 1)
            if before is not None:
                row["config_changed"] = setting_changes(before, config)
            row["eval_comparable"] = not any(k.startswith("eval.") and not _how_eval_runs(k) for k in changed_keys(configs[min(configs)], config))
    return rows


def _round_config(run_dir: Path, r: int) -> dict[str, Any] | None:
    """Round ``r``'s recorded config read through today's schema (a key added since is its default, not a change)."""
    return recorded_config(round_dir(run_dir, r))


def recorded_config(directory: Path) -> dict[str, Any] | None:
    """The config recorded in a run or round directory, read through today's schema; None where there is none."""
    path = directory / CONFIG_FILE
    return as_now(IterateConfig, read_yaml(path)) if path.exists() else None


def _how_eval_runs(key: str) -> bool:
    """An eval key that says how an eval runs (workers, engine memory), not what it measures."""
    return any(key == f"eval.{h}" or key.startswith(f"eval.{h}.") for h in HOW_IT_RUNS)


def lineage(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / LINEAGE_FILE
    return read_json(path, needs="parent") if path.exists() else None


def _reward_stats(scored: Path) -> dict[str, Any]:
    if read_manifest(scored) is None:  # still scoring (or killed): a part is not the round's rewards
        return {}
    t = read_table(scored, columns=["reward", "verdict"])
    rewards = t.column("reward").to_numpy()
    counts = pc.value_counts(t.column("verdict"))  # in order of first appearance, as a count in Python was (0.5 s a million rows)
    verdicts = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    return {
        "train_samples": int(t.num_rows),
        "reward_mean": float(rewards.mean()),
        "reward_positive_share": float((rewards > 0).mean()),
        "verdicts": verdicts,
    }


def loss_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    curves = {}
    candidates = [run_dir / "warmstart" / "policy"] + [d / "policy" for d in round_dirs(run_dir).values()]
    for policy in candidates:
        f = policy / "metrics.jsonl"
        if not f.exists():
            continue
        points = []
        for rec in read_jsonl_records(f):
            if "loss" in rec and "step" in rec:
                points.append((int(rec["step"]), math.nan if rec["loss"] is None else float(rec["loss"])))  # null: a diverged step
        if points:
            curves[policy.parent.name] = points
    return curves


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def with_interval(metrics: dict[str, Any], key: str, digits: int = 4) -> str | None:
    """A metric and, where ``metrics["intervals"]`` has one, its 95% interval over prompts: ``0.4120 [0.3710, 0.4550]``."""
    if metrics.get(key) is None:
        return None
    low_high = (metrics.get("intervals") or {}).get(key)
    return f"{metrics[key]:.{digits}f}" + (f" [{low_high[0]:.{digits}f}, {low_high[1]:.{digits}f}]" if low_high else "")  # one precision


def _with_ci(row: dict[str, Any], key: str) -> str:
    """A summary.md cell: a metric with its interval where the eval has one (``0.412 [0.371, 0.455]``), else as :func:`fmt` writes it."""
    return with_interval(row, key, digits=3) if (row.get("intervals") or {}).get(key) and row.get(key) is not None else fmt(row.get(key))


def markdown(rows: list[dict[str, Any]], run_dir: Path) -> str:
    k = eval_k(rows)
    cols = [("round", "round"), ("pass@1", "pass@1"), (f"maj@{k}", "maj@k"), (f"pass@{k}", "pass@k"), ("greedy", "greedy_accuracy"),
            ("invalid", "invalid_rate"), ("p", "p"), ("c", "c"), ("p̃ target", "p_target"), ("p̃", "p_effective"), ("train rows", "rows_out"), ("mean reward", "reward_mean")]
    if any("best_of_k_verifier" in r for r in rows):  # a generative verifier judged candidates each round
        cols[6:6] = [("maj@k (candidates)", "candidates_maj@k"), ("best-of-k (verifier)", "best_of_k_verifier"),
                     ("weighted maj@k", "weighted_maj@k"), ("verifier accuracy", "verifier_accuracy"),
                     ("verifier invalid", "verifier_invalid_rate"), ("verifier AUC", "verifier_auc")]
    lines = [f"# Run report: {run_dir}", "", "| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_with_ci(row, k) for _, k in cols) + " |")
    boot = next((r["bootstrap"] for r in rows if r.get("bootstrap")), None)
    if boot:
        lines += ["", f"[low, high]: 95% percentile bootstrap interval over prompts ({boot['resamples']} resamples, seed {boot['seed']})."]
    lines += _changes(rows, run_dir)
    for r in (r for r in rows if unfinished(r)):  # a killed round read as the run's last word
        lines += ["", f"Round {r['round']} is not finished (no trained policy yet): running, or stopped — the same `topr iterate` resumes it."]
    for r in rows:
        if r.get("error_rate") or r.get("greedy_error_rate"):  # counted wrong: a missing gold, a failing plugin
            lines += ["", f"Round {r['round']}: {r.get('error_rate') or 0:.1%} of the samples and {r.get('greedy_error_rate') or 0:.1%} of the "
                      "greedy completions could not be checked (verifier error or timeout) and count as wrong."]
    comparable = [r for r in rows if r.get("pass@1") is not None and r.get("eval_comparable") is not False]  # same eval settings
    first, last = (comparable[0], comparable[-1]) if comparable else (None, None)
    if first is not None and last is not first:
        delta = 100 * (last["pass@1"] - first["pass@1"])
        lines += ["", f"pass@1 went from {100 * first['pass@1']:.1f}% (round {first['round']}) to "
                  f"{100 * last['pass@1']:.1f}% (round {last['round']}): {delta:+.1f} points."]
    lines += ["", "Plots: `accuracy.png`, `mix.png`, `rewards.png`, `loss.png`.", ""]
    return "\n".join(lines)


def unfinished(row: dict[str, Any]) -> bool:
    """A round with no trained policy yet (running, or stopped); round 0 is the base policy's eval, never trained."""
    return row["round"] > 0 and "train_steps" not in row


def planned_rounds(run_dir: str | Path) -> int:
    """The rounds the run's recorded config asks for (0: none recorded)."""
    path = Path(run_dir) / CONFIG_FILE
    return int(read_yaml(path).get("rounds") or 0) if path.is_file() else 0


def eval_k(rows: list[dict[str, Any]]) -> str:
    """The k of the rounds' maj@k and pass@k, for their column names: ``8``; ``k`` when rounds differ or none was evaluated."""
    ks = {r["k"] for r in rows if r.get("k") is not None}
    return str(ks.pop()) if len(ks) == 1 else "k"


def _changes(rows: list[dict[str, Any]], run_dir: Path) -> list[str]:
    """Lineage and what changed when, in words."""
    out = []
    if (lin := lineage(run_dir)) is not None:
        out += ["", f"Branched from {lin['parent']} at round {lin['round']} (changed: {', '.join(lin['changed']) or 'nothing'})."]
    for r in rows:
        if r.get("config_changed"):
            out += ["", f"Round {r['round']} ran with changed settings: {', '.join(r['config_changed'])}."]
        if r.get("eval_comparable") is False:
            out += [f"Round {r['round']}'s eval settings differ from round 0's: its accuracy is not comparable with earlier rounds."]
    return out


# accuracy.png's lines: what a round's eval measures (and its settings change).
ACCURACY = (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"), ("invalid_rate", "invalid rate"),
            ("best_of_k_verifier", "best-of-k (verifier)"), ("weighted_maj@k", "verifier-weighted maj@k"))
EVAL_KEYS = tuple(key for key, _ in ACCURACY)


def plot_series(ax: Any, rows: list[dict[str, Any]], key: str, label: str, color: str | None = None, bars: tuple[str, ...] = ("intervals",)) -> None:
    """One metric over rounds, with error bars where a round's row has them (``bars``: the first of those keys that has
    the metric: a run's 95% interval, a seed variant's ``spread``); an eval metric of rounds evaluated with other
    settings (``eval_comparable``) is drawn apart, unjoined to the rounds before it, in the same colour."""
    apart = key in EVAL_KEYS and any(r.get("eval_comparable") is False for r in rows)
    parts = [([r for r in rows if r.get("eval_comparable") is not False], label, "-")]
    if apart:
        parts.append(([r for r in rows if r.get("eval_comparable") is False], f"{label} (other eval settings)", "none"))
    for part, name, line in parts:
        pts = [(r["round"], r[key], next((r[b][key] for b in bars if key in (r.get(b) or {})), None)) for r in part if r.get(key) is not None]
        if pts:
            xs, ys, cis = zip(*pts)
            # A percentile interval need not contain the mean (few resamples): matplotlib refuses negative error bars.
            err = [[max(0.0, y - (c or (y, y))[0]) for y, c in zip(ys, cis)], [max(0.0, (c or (y, y))[1] - y) for y, c in zip(ys, cis)]]
            drawn = ax.errorbar(xs, ys, yerr=err if any(cis) else None, marker="o" if line == "-" else "s", linestyle=line, capsize=3,
                                label=name, color=color)
            color = drawn.lines[0].get_color()


def _round_plot(rows: list[dict[str, Any]], path: Path, title: str, ylabel: str, series: tuple[tuple[str, str], ...]) -> None:
    """One line per metric over rounds, on a 0..1 scale, with its 95% interval as error bars where the eval has one."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in series:
        plot_series(ax, rows, key, label)
    ax.set(xlabel="round", ylabel=ylabel, title=title, ylim=(0, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> tuple[list[dict[str, Any]], Path]:
    """Collect the metrics, draw the plots and write ``summary.md``, in ``out`` (default ``RUN_DIR/report``)."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    rows, curves = collect(run_dir), loss_curves(run_dir)  # everything read before anything is written
    out = run_dir / "report" if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)

    _round_plot(rows, out / "accuracy.png", "Evaluation per round", "rate", ACCURACY)
    _round_plot(rows, out / "mix.png", "Training mix per round", "share",
                (("p", "raw positive share p"), ("p_target", "p̃ target"), ("p_effective", "effective positive share p̃")))

    _rewards_plot(rows, out / "rewards.png")
    _loss_plot(curves, out / "loss.png")
    (out / "summary.md").write_text(markdown(rows, run_dir))
    return rows, out


def _rewards_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    scored = [r for r in rows if r.get("verdicts")]
    bottom = [0.0] * len(scored)
    for verdict, color in VERDICT_COLORS.items():
        shares = [r["verdicts"].get(verdict, 0) / r["train_samples"] for r in scored]
        if any(shares):
            ax.bar([r["round"] for r in scored], shares, bottom=bottom, color=color, label=verdict)
            bottom = [b + s for b, s in zip(bottom, shares)]
    ax.set(xlabel="round", ylabel="share of training samples", title="Rewards of the generated samples")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if scored:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _loss_plot(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """The rounds' training loss over the run's steps (each round's after the last: they were drawn on one another at
    steps 1..n), and the warm start's (supervised, on another scale) in a panel of its own."""
    import matplotlib.pyplot as plt

    warm = curves.get("warmstart")
    rounds = {name: points for name, points in curves.items() if name != "warmstart"}
    fig, axes = plt.subplots(1, 2 if warm else 1, figsize=(11 if warm else 6, 4), squeeze=False)
    offset = 0
    for name, points in rounds.items():
        axes[0][0].plot([offset + step for step, _ in points], [loss for _, loss in points], label=name)
        offset += max(step for step, _ in points)
    axes[0][0].set(xlabel="step (over the run's rounds)", ylabel="loss", title="Training loss per round")
    if warm:
        axes[0][1].plot(*zip(*warm), color="gray")
        axes[0][1].set(xlabel="step", ylabel="loss", title="Warm start (supervised)")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
