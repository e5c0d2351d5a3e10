"""`topr report RUN RUN ... --out DIR`: runs compared.

Runs whose settings differ only in their seeds (:data:`SEED_KEYS`) are one *variant*, reported as the mean and
standard deviation over its seeds (a single run is a variant of one). Each variant is shown at the last round all its
runs evaluated; its curves go on shared axes (``compare.png``), its numbers beside the others' (``compare.md``), and
each variant is paired with the first over the prompts both evaluated: per prompt the mean over seeds, with a paired
bootstrap interval over prompts (``benchmarks/compare_rl.py`` reports its seeds the same way).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from toprcli.data.formats import get_path
from toprcli.errors import UserError
from toprcli.report import collect, fmt, lineage, plot_series, recorded_config
from toprcli.runs import round_dirs, setting_changes
from toprcli.shards import read_json

# Seeds of the randomness a run draws (not of its data: dataset seeds pick other problems, few-shot seeds other prompts).
SEED_KEYS = ("warm_start.model_seed", "generate.sampling.seed", "curate.seed", "train.seed", "eval.sampling.seed", "eval.bootstrap_seed")
# The training loss is not among them: losses differ in scale and meaning (DPO starts at log 2); each run's loss.png has it.
COMPARED = (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"), ("reward_positive_share", "correct share of the samples"),
            ("p", "p (correct share of the training rows)"), ("p_effective", "p̃ (effective positive share)"))
RATES = tuple(key for key, _ in COMPARED)  # drawn on 0..1
SHOWN_KEYS = 4  # settings named in a label; compare.md lists them all


def group_seeds(configs: list[dict[str, Any] | None]) -> list[list[int]]:
    """Indices of the runs by variant, in the order first given: a run joins a variant when it differs from each of its
    runs in seeds alone, and in some seed (the same config twice is a repeat, not another seed)."""
    groups: list[list[int]] = []
    for i, cfg in enumerate(configs):
        home = next((g for g in groups if cfg is not None and all(
            configs[j] is not None and (d := setting_changes(configs[j], cfg)) and set(d) <= set(SEED_KEYS) for j in g)), None)
        if home is None:
            groups.append([i])
        else:
            home.append(i)
    return groups


def run_names(dirs: list[Path]) -> list[str]:
    """Each run's directory name; where two share one (a/demo, b/demo), their paths below the common parent."""
    names = [d.name for d in dirs]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([d.resolve() for d in dirs]))
    return [str(d.resolve().relative_to(common)) if d.resolve() != common else str(d) for d in dirs]


def label(names: list[str], cfg: dict[str, Any] | None, reference: dict[str, Any] | None, rows: list[dict[str, Any]],
          first: int = 1) -> tuple[str, list[str]]:
    """A variant's name (its runs') and what differs in its settings from the first variant's, and what it changed on the
    way (``--apply-from-next-round``), each of those with the round it applies from (``first``: the first round the run
    made itself, a branch's after the rounds it took from its parent); (label, every difference)."""
    changed_on_the_way = {k for r in rows if r["round"] > first for k in r.get("config_changed") or []}
    differs = set(setting_changes(reference, cfg)) if reference is not None else set()
    keys = sorted(k for k in differs | changed_on_the_way if k not in SEED_KEYS)

    def said(key: str) -> str:
        since = max((r["round"] for r in rows if r["round"] > first and key in (r.get("config_changed") or [])), default=None)
        return f"{key}={get_path(cfg or {}, key)}" + (f" from round {since}" if since is not None else "")

    shown = [said(k) for k in keys]
    name = "+".join(names) if len("+".join(names)) <= 40 else f"{names[0]} +{len(names) - 1}"
    detail = ", ".join(shown[:SHOWN_KEYS]) + (f" +{len(shown) - SHOWN_KEYS} more" if len(shown) > SHOWN_KEYS else "")
    seeds = f"{len(names)} seeds" if len(names) > 1 else ""
    inside = "; ".join(part for part in (detail, seeds) if part)
    return (f"{name} ({inside})" if inside else name), shown


def evaluated(rows: list[dict[str, Any]]) -> set[int]:
    """The rounds with an eval (an unfinished round, or one ``eval_every`` skipped, has none)."""
    return {r["round"] for r in rows if r.get("pass@1") is not None}


def last_evaluated(rows: list[dict[str, Any]]) -> int:
    """The last round with an eval; the last round if none has one."""
    return max(evaluated(rows), default=rows[-1]["round"])


def _mean_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round every run of a variant has: each compared metric's mean over its runs, with mean ± one standard
    deviation as its interval (the run's own rows when the variant is one run)."""
    if len(runs) == 1:
        return runs[0]["rounds"]
    by_round = [{r["round"]: r for r in run["rounds"]} for run in runs]
    out = []
    for rnd in sorted(set.intersection(*(set(b) for b in by_round))):
        row: dict[str, Any] = {"round": rnd, "intervals": {}, "seeds": {}}
        for key, _ in COMPARED:
            values = [b[rnd][key] for b in by_round if b[rnd].get(key) is not None]
            if len(values) == len(runs):
                mean, sd = statistics.fmean(values), statistics.stdev(values)
                row[key], row["intervals"][key], row["seeds"][key] = mean, [mean - sd, mean + sd], {"mean": mean, "std": sd, "values": values}
        out.append(row)
    return out


def variants(dirs: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(runs, variants): every run's rounds and label, and the runs grouped by seed with their compared round."""
    configs, names = [recorded_config(d) for d in dirs], run_names(dirs)
    runs = [{"run_dir": str(d), "name": n, "lineage": lineage(d), "rounds": collect(d)} for d, n in zip(dirs, names)]
    out = []
    for group in group_seeds(configs):
        members = [runs[i] for i in group]
        first = members[0]["lineage"]["round"] + 1 if members[0]["lineage"] else 1  # a branch's own rounds start after its parent's
        text, keys = label([m["name"] for m in members], configs[group[0]], configs[0] if out else None, members[0]["rounds"], first)
        rounds = [last_evaluated(m["rounds"]) for m in members]
        series = _mean_rows(members)
        at = max(set.intersection(*(evaluated(m["rounds"]) for m in members)), default=min(rounds))  # the last all seeds evaluated
        final = next((r for r in series if r["round"] == at), series[-1] if series else {"round": at})
        for m in members:
            m["label"] = text
        out.append({"label": text, "differs": keys, "runs": [m["run_dir"] for m in members], "round": at,
                    "rounds_evaluated": dict(zip((m["name"] for m in members), rounds)), "final": final, "series": series})
    return runs, out


def paired_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Variant ``b`` minus variant ``a``, per metric, from their runs' evals (``eval.json``, one round each): per prompt
    the mean over a variant's seeds, paired over the prompts both evaluated, with a paired bootstrap interval (None when
    an eval has no per-prompt scores)."""
    from toprcli.evaluation import paired_bootstrap_interval

    if not a or not b or any("per_prompt" not in e for e in a + b):
        return None
    boot = a[0]["metrics"].get("bootstrap", {})
    out: dict[str, Any] = {"rounds": [a[0]["iteration"], b[0]["iteration"]], "bootstrap": boot}
    if different := sorted(k for k, v in _task(a[0]).items() if any(_task(e)[k] != v for e in a + b)):
        return {**out, "not_comparable": different}
    for key in sorted(set.intersection(*(set(e["per_prompt"]) for e in a + b))):  # a stable order in compare.md
        pa, pb = _seed_mean([e["per_prompt"][key] for e in a]), _seed_mean([e["per_prompt"][key] for e in b])
        shared = set(pa) & set(pb)
        if shared:
            lo, hi, n = paired_bootstrap_interval(pb, pa, resamples=boot.get("resamples", 1000), seed=boot.get("seed", 0))
            out[key] = {"difference": sum(pb[p] - pa[p] for p in shared) / n, "interval": [lo, hi], "prompts": n, "outside_noise": lo > 0 or hi < 0}
    return out


def _task(e: dict[str, Any]) -> dict[str, Any]:
    """What an eval measures: pairs are prompts of one task (another test set, k, sampling distribution or verifier
    measures something else); a seed, or how many of the set's prompts (``limit``: pairs are the prompts both have), is not."""
    c = e.get("config") or {}
    return {"dataset": {k: v for k, v in (c.get("dataset") or {}).items() if k != "limit"}, "k": c.get("k"), "verifier": c.get("verifier"),
            "sampling": {k: v for k, v in (c.get("sampling") or {}).items() if k != "seed"}}


def _seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Per prompt, the mean over seeds, on the prompts every seed evaluated."""
    shared = set.intersection(*(set(s) for s in per_seed))
    return {p: statistics.fmean(s[p] for s in per_seed) for p in shared}


def evals_at(run_dirs: list[str], r: int) -> list[dict[str, Any]]:
    """Round ``r``'s ``eval.json`` of each run (those that have one)."""
    paths = [round_dirs(Path(d)).get(r) for d in run_dirs]
    return [read_json(p / "eval" / "eval.json", needs="metrics") for p in paths if p is not None and (p / "eval" / "eval.json").exists()]


def write_comparison(run_dirs: list[str | Path], out: str | Path) -> tuple[dict[str, Any], Path]:
    """Read every run, then draw ``compare.png`` and write ``compare.md`` in ``out``: ({"runs", "variants"}, out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    dirs = [Path(d) for d in run_dirs]
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise UserError("a run is given twice — compare different runs")
    runs, groups = variants(dirs)
    first = evals_at(groups[0]["runs"], groups[0]["round"])
    for group in groups[1:]:
        group["paired_vs_first"] = paired_difference(first, evals_at(group["runs"], group["round"]))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.2))
    axes = grid.ravel()  # one panel per COMPARED metric
    for ax, (key, title) in zip(axes, COMPARED):
        for i, group in enumerate(groups):
            plot_series(ax, group["series"], key, group["label"], color=f"C{i % 10}")  # a variant's colour in every panel
        ax.set(xlabel="round", title=title, **({"ylim": (0, 1)} if key in RATES else {}))  # p̃ 0.4999999 and 0.5 are one value
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(groups), 3), fontsize="small")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)
    (out / "compare.md").write_text(comparison_markdown(groups, runs))
    return {"runs": runs, "variants": groups}, out


def final_rows(groups: list[dict[str, Any]]) -> list[list[Any]]:
    """Metric × variant, at each variant's compared round: a run's value, or a variant's mean ± standard deviation."""
    def cell(group: dict[str, Any], key: str) -> Any:
        seeds = (group["final"].get("seeds") or {}).get(key)
        return f"{seeds['mean']:.3f} ± {seeds['std']:.3f}" if seeds else group["final"].get(key)

    return [["round", *[g["round"] for g in groups]], *[[title, *[cell(g, key) for g in groups]] for key, title in COMPARED]]


def notes(groups: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """What the table alone does not say, a sentence each: the seeds, rounds compared, branches, every difference in
    settings, and each variant's paired difference with the first."""
    lines = []
    for g in (g for g in groups if len(g["runs"]) > 1):
        lines.append(f"{g['label']}: mean ± standard deviation over {len(g['runs'])} seeds ({', '.join(g['rounds_evaluated'])}).")
    rounds = {g["label"]: g["round"] for g in groups}
    if len(set(rounds.values())) > 1:
        lines.append("compared at their last evaluated rounds, which differ: " + ", ".join(f"{k} round {v}" for k, v in rounds.items()) + ".")
    for g in groups:
        if len(set(g["rounds_evaluated"].values())) > 1:
            lines.append(f"{g['label']}: its runs were evaluated to different rounds ({', '.join(f'{k} {v}' for k, v in g['rounds_evaluated'].items())}): "
                         f"compared at round {g['round']}, the last all have.")
        if len(g["differs"]) > SHOWN_KEYS:
            lines.append(f"{g['label']} differs from {groups[0]['label']} in: {', '.join(g['differs'])}.")
    lines += [f"{run['name']}: branched from {run['lineage']['parent']} at round {run['lineage']['round']}." for run in runs if run["lineage"]]
    for g in groups[1:]:
        paired = g.get("paired_vs_first") or {}
        if paired.get("not_comparable"):
            lines.append(f"{g['label']} and {groups[0]['label']} were evaluated differently ({', '.join(paired['not_comparable'])}): no paired difference.")
        for key, d in ((k, d) for k, d in paired.items() if isinstance(d, dict) and "interval" in d):
            ra, rb = paired["rounds"]
            lines.append(f"{g['label']} (round {rb}) − {groups[0]['label']} (round {ra}), {key}: {d['difference']:+.3f} "
                         f"[{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}] over {d['prompts']} shared prompts (paired bootstrap): "
                         f"{'outside' if d['outside_noise'] else 'within'} the noise.")
    return lines


def comparison_markdown(groups: list[dict[str, Any]], runs: list[dict[str, Any]] | None = None) -> str:
    head = ["metric", *[g["label"] for g in groups]]
    lines = ["# Runs compared", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in final_rows(groups)]
    for note in notes(groups, runs or []):
        lines += ["", note]
    return "\n".join(lines + ["", "Plot: `compare.png`.", ""])
