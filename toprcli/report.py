"""`topr report`: per-round metrics of a run directory, as PNG plots and markdown.

Reads ``RUN_DIR/round-*/eval/eval.json``, ``round-*/train.parquet`` metadata,
``round-*/scored/`` rewards and verdicts, and ``*/policy/metrics.jsonl``.
Writes ``RUN_DIR/report/{accuracy,mix,rewards,loss}.png`` and
``RUN_DIR/report/summary.md``; each round says which settings changed from the round before
(``round-*/config.yaml``) and a branch names its parent (``lineage.json``). Several runs are
compared on shared axes (:func:`write_comparison`), each named by what differs in its config.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from toprcli.config import IterateConfig, as_now, read_yaml
from toprcli.errors import UserError
from toprcli.runs import run_summary
from toprcli.runs import CONFIG_FILE, LINEAGE_FILE, round_dir, round_dirs
from toprcli.shards import changed_keys, read_json, read_jsonl_records, read_manifest, read_table
from toprcli.stages.eval import HOW_IT_RUNS

VERDICT_COLORS = {"correct": "#2e7d32", "incorrect": "#c62828", "no_answer": "#9e9e9e", "timeout": "#6a1b9a", "error": "#ef6c00"}


def collect(run_dir: str | Path) -> list[dict[str, Any]]:
    """Per-round metrics: pass@1, maj@k, invalid rate, p, p̃, reward stats, training loss."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run dir not found: {run_dir} — pass the --run-dir of a `topr iterate` run")
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
                # As runs.reconcile counts a change: where the run lives and what it reports to are not its settings.
                row["config_changed"] = sorted(k for k in changed_keys(before, config) - {"rounds", "run_dir"} if not k.startswith("tracking."))
            row["eval_comparable"] = not any(k.startswith("eval.") and not _how_eval_runs(k) for k in changed_keys(configs[min(configs)], config))
    return rows


def _round_config(run_dir: Path, r: int) -> dict[str, Any] | None:
    """Round ``r``'s recorded config read through today's schema (a key added since is its default, not a change)."""
    return _config_in(round_dir(run_dir, r))


def _config_in(directory: Path) -> dict[str, Any] | None:
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


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _with_ci(row: dict[str, Any], key: str) -> str:
    """A metric and, where the eval has one, its 95% interval: ``0.412 [0.371, 0.455]``."""
    ci = (row.get("intervals") or {}).get(key)
    return _fmt(row.get(key)) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def markdown(rows: list[dict[str, Any]], run_dir: Path) -> str:
    cols = [("round", "round"), ("pass@1", "pass@1"), ("maj@k", "maj@k"), ("pass@k", "pass@k"), ("greedy", "greedy_accuracy"),
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
    comparable = [r for r in rows if r.get("pass@1") is not None and r.get("eval_comparable") is not False]  # same eval settings
    first, last = (comparable[0], comparable[-1]) if comparable else (None, None)
    if first is not None and last is not first:
        delta = 100 * (last["pass@1"] - first["pass@1"])
        lines += ["", f"pass@1 went from {100 * first['pass@1']:.1f}% (round {first['round']}) to "
                  f"{100 * last['pass@1']:.1f}% (round {last['round']}): {delta:+.1f} points."]
    lines += ["", "Plots: `accuracy.png`, `mix.png`, `rewards.png`, `loss.png`.", ""]
    return "\n".join(lines)


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


def _series(ax: Any, rows: list[dict[str, Any]], key: str, label: str) -> None:
    """One metric over rounds, with its 95% interval as error bars where the round's eval has one."""
    pts = [(r["round"], r[key], (r.get("intervals") or {}).get(key)) for r in rows if r.get(key) is not None]
    if pts:
        xs, ys, cis = zip(*pts)
        # A percentile interval need not contain the mean (few resamples): matplotlib refuses negative error bars.
        err = [[max(0.0, y - (c or (y, y))[0]) for y, c in zip(ys, cis)], [max(0.0, (c or (y, y))[1] - y) for y, c in zip(ys, cis)]]
        ax.errorbar(xs, ys, yerr=err if any(cis) else None, marker="o", capsize=3, label=label)


def _round_plot(rows: list[dict[str, Any]], path: Path, title: str, ylabel: str, series: tuple[tuple[str, str], ...]) -> None:
    """One line per metric over rounds, on a 0..1 scale, with its 95% interval as error bars where the eval has one."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in series:
        _series(ax, rows, key, label)
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
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    rows, curves = collect(run_dir), loss_curves(run_dir)  # everything read before anything is written
    out = run_dir / "report" if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)

    _round_plot(rows, out / "accuracy.png", "Evaluation per round", "rate",
                (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"), ("invalid_rate", "invalid rate"),
                 ("best_of_k_verifier", "best-of-k (verifier)"), ("weighted_maj@k", "verifier-weighted maj@k")))
    _round_plot(rows, out / "mix.png", "Training mix per round", "share",
                (("p", "raw positive share p"), ("p_target", "p̃ target"), ("p_effective", "effective positive share p̃")))

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
    for name, points in curves.items():
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


COMPARED = (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("p", "p (raw positive share)"), ("p_effective", "p̃ (effective positive share)"),
            ("train_final_loss", "training loss (final step)"))


def run_label(run_dir: Path, reference: dict[str, Any] | None, name: str | None = None) -> str:
    """A run's name in a comparison: its directory (``name``), and what differs in its config from the first run's."""
    cfg = _config_in(run_dir) or {}
    keys = sorted(k for k in changed_keys(reference, cfg) - {"run_dir", "rounds"} if not k.startswith("tracking.")) if reference is not None else []

    def value(key: str) -> Any:
        node: Any = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    diff = ", ".join(f"{k}={value(k)}" for k in keys[:3]) + (" ..." if len(keys) > 3 else "")
    name = name or run_dir.name
    return f"{name} ({diff})" if diff else name


def run_names(dirs: list[Path]) -> list[str]:
    """Each run's directory name; where two share one (a/demo, b/demo), their paths below the common parent."""
    names = [d.name for d in dirs]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([d.resolve() for d in dirs]))
    return [str(d.resolve().relative_to(common)) if d.resolve() != common else str(d) for d in dirs]


def write_comparison(run_dirs: list[str | Path], out: str | Path) -> tuple[list[dict[str, Any]], Path]:
    """Several runs on one set of axes per metric (``compare.png``) and their final rounds side by side (``compare.md``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    dirs = [Path(d) for d in run_dirs]
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise UserError("a run is given twice — compare different runs")
    reference = _config_in(dirs[0])
    runs = [{"run_dir": str(d), "label": run_label(d, reference if i else None, name), "lineage": lineage(d), "rounds": collect(d)}
            for i, (d, name) in enumerate(zip(dirs, run_names(dirs)))]
    for run in runs[1:]:
        run["paired_vs_first"] = paired_difference(dirs[0], Path(run["run_dir"]))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(COMPARED), figsize=(4 * len(COMPARED), 3.6))
    for ax, (key, title) in zip(axes, COMPARED):
        for run in runs:
            _series(ax, run["rounds"], key, run["label"])
        ax.set(xlabel="round", title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(runs), 3), fontsize="small")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)
    (out / "compare.md").write_text(comparison_markdown(runs))
    return runs, out


def paired_difference(a: Path, b: Path) -> dict[str, Any] | None:
    """``b``'s final evaluated round minus ``a``'s, per metric, with a paired bootstrap interval over the
    prompts both were evaluated on (None when either has no per-prompt scores or they share no prompt)."""
    from toprcli.evaluation import paired_bootstrap_interval

    def last_eval(run: Path) -> dict[str, Any] | None:
        evals = [d / "eval" / "eval.json" for d in round_dirs(run).values() if (d / "eval" / "eval.json").exists()]
        return read_json(evals[-1], needs="metrics") if evals else None

    ea, eb = last_eval(a), last_eval(b)
    if not ea or not eb or "per_prompt" not in ea or "per_prompt" not in eb:
        return None
    boot = ea["metrics"].get("bootstrap", {})
    out: dict[str, Any] = {"rounds": [ea["iteration"], eb["iteration"]], "bootstrap": boot}
    # Pairs are prompts of one eval task: another test set, k, sampling distribution or verifier measures something else.
    def task(e: dict[str, Any]) -> dict[str, Any]:
        c = e.get("config") or {}
        return {"dataset": c.get("dataset"), "k": c.get("k"), "verifier": c.get("verifier"),
                "sampling": {k: v for k, v in (c.get("sampling") or {}).items() if k != "seed"}}

    if different := sorted(k for k, v in task(ea).items() if task(eb)[k] != v):
        return {**out, "not_comparable": different}
    for key in sorted(set(ea["per_prompt"]) & set(eb["per_prompt"])):  # a stable order in compare.md
        pa, pb = ea["per_prompt"][key], eb["per_prompt"][key]
        shared = set(pa) & set(pb)
        if shared:
            lo, hi, n = paired_bootstrap_interval(pb, pa, resamples=boot.get("resamples", 1000), seed=boot.get("seed", 0))
            out[key] = {"difference": sum(pb[p] - pa[p] for p in shared) / n, "interval": [lo, hi], "prompts": n,
                        "outside_noise": lo > 0 or hi < 0}
    return out


def final_rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    """Metric × run: each run's last round."""
    last = [run["rounds"][-1] for run in runs]
    return [["round", *[r["round"] for r in last]], *[[title, *[r.get(key) for r in last]] for key, title in COMPARED]]


def comparison_markdown(runs: list[dict[str, Any]]) -> str:
    head = ["metric", *[run["label"] for run in runs]]
    lines = ["# Runs compared", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in final_rows(runs)]
    for run in runs:
        if run["lineage"]:
            lines += ["", f"{run['label']}: branched from {run['lineage']['parent']} at round {run['lineage']['round']}."]
        if (run.get("paired_vs_first") or {}).get("not_comparable"):
            lines += ["", f"{run['label']} and {runs[0]['label']} were evaluated differently "
                          f"({', '.join(run['paired_vs_first']['not_comparable'])}): no paired difference."]
        for key, d in (run.get("paired_vs_first") or {}).items():
            if isinstance(d, dict) and "interval" in d:
                verdict = "outside the noise" if d["outside_noise"] else "within the noise"
                ra, rb = run["paired_vs_first"]["rounds"]  # the last evaluated rounds, which the table's last round may not be
                lines += ["", f"{run['label']} (round {rb}) − {runs[0]['label']} (round {ra}), {key}: {d['difference']:+.3f} "
                              f"[{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}] over {d['prompts']} shared prompts (paired bootstrap): {verdict}."]
    return "\n".join(lines + ["", "Plot: `compare.png`.", ""])
