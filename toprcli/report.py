"""`topr report`: per-round metrics of a run directory, as PNG plots and markdown.

Reads ``RUN_DIR/round-*/eval/eval.json``, ``round-*/train.parquet`` metadata,
``round-*/scored/`` rewards and verdicts, and ``*/policy/metrics.jsonl``.
Writes ``RUN_DIR/report/{accuracy,mix,rewards,loss}.png`` and
``RUN_DIR/report/summary.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toprcli.errors import UserError
from toprcli.pipeline import round_dir, run_summary
from toprcli.shards import complete_shards, read_table

VERDICT_COLORS = {"correct": "#2e7d32", "incorrect": "#c62828", "no_answer": "#9e9e9e", "timeout": "#6a1b9a", "error": "#ef6c00"}


def collect(run_dir: str | Path) -> list[dict[str, Any]]:
    """Per-round metrics: pass@1, maj@k, invalid rate, p, p̃, reward stats, training loss."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run dir not found: {run_dir} — pass the --run-dir of a `topr iterate` run")
    rows = run_summary(run_dir)
    if not rows:
        raise UserError(f"{run_dir} has no round-* directories — is it a `topr iterate` run dir?")
    for row in rows:
        row.update(_reward_stats(round_dir(run_dir, row["round"]) / "scored"))
    return rows


def _reward_stats(scored: Path) -> dict[str, Any]:
    if not complete_shards(scored):
        return {}
    t = read_table(scored, columns=["reward", "verdict"])
    rewards = t.column("reward").to_numpy()
    verdicts: dict[str, int] = {}
    for v in t.column("verdict").to_pylist():
        verdicts[v] = verdicts.get(v, 0) + 1
    return {
        "train_samples": int(t.num_rows),
        "reward_mean": float(rewards.mean()),
        "reward_positive_share": float((rewards > 0).mean()),
        "verdicts": verdicts,
    }


def loss_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    curves = {}
    candidates = [run_dir / "warmstart" / "policy"] + sorted(p / "policy" for p in run_dir.glob("round-*"))
    for policy in candidates:
        f = policy / "metrics.jsonl"
        if not f.exists():
            continue
        points = []
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec and "step" in rec:
                points.append((int(rec["step"]), float(rec["loss"])))
        if points:
            curves[policy.parent.name] = points
    return curves


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def markdown(rows: list[dict[str, Any]], run_dir: Path) -> str:
    cols = [("round", "round"), ("pass@1", "pass@1"), ("maj@k", "maj@k"), ("pass@k", "pass@k"), ("greedy", "greedy_accuracy"),
            ("invalid", "invalid_rate"), ("p", "p"), ("c", "c"), ("p̃", "p_effective"), ("train rows", "rows_out"), ("mean reward", "reward_mean")]
    if any("best_of_k_verifier" in r for r in rows):  # a generative verifier judged candidates each round
        cols[6:6] = [("maj@k (candidates)", "candidates_maj@k"), ("best-of-k (verifier)", "best_of_k_verifier"),
                     ("weighted maj@k", "weighted_maj@k"), ("verifier accuracy", "verifier_accuracy"),
                     ("verifier invalid", "verifier_invalid_rate"), ("verifier AUC", "verifier_auc")]
    lines = [f"# Run report: {run_dir}", "", "| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for _, k in cols) + " |")
    first = next((r for r in rows if r.get("pass@1") is not None), None)
    last = next((r for r in reversed(rows) if r.get("pass@1") is not None), None)
    if first is not None and last is not None and last is not first:
        delta = 100 * (last["pass@1"] - first["pass@1"])
        lines += ["", f"pass@1 went from {100 * first['pass@1']:.1f}% (round {first['round']}) to "
                  f"{100 * last['pass@1']:.1f}% (round {last['round']}): {delta:+.1f} points."]
    lines += ["", "Plots: `accuracy.png`, `mix.png`, `rewards.png`, `loss.png`.", ""]
    return "\n".join(lines)


def _round_plot(rows: list[dict[str, Any]], path: Path, title: str, ylabel: str, series: tuple[tuple[str, str], ...]) -> None:
    """One line per metric over rounds, on a 0..1 scale."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in series:
        pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    ax.set(xlabel="round", ylabel=ylabel, title=title, ylim=(0, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(run_dir: str | Path) -> tuple[list[dict[str, Any]], Path]:
    """Collect the metrics, draw the plots and write ``report/summary.md``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    rows = collect(run_dir)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)

    _round_plot(rows, out / "accuracy.png", "Evaluation per round", "rate",
                (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"), ("invalid_rate", "invalid rate"),
                 ("best_of_k_verifier", "best-of-k (verifier)"), ("weighted_maj@k", "verifier-weighted maj@k")))
    _round_plot(rows, out / "mix.png", "Training mix per round", "share",
                (("p", "raw positive share p"), ("p_effective", "effective positive share p̃")))

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
    fig.savefig(out / "rewards.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in loss_curves(run_dir).items():
        ax.plot(*zip(*points), label=name)
    ax.set(xlabel="step", ylabel="loss", title="Training loss")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)

    (out / "summary.md").write_text(markdown(rows, run_dir))
    return rows, out
