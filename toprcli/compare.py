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
from toprcli.runs import round_dir, round_dirs, setting_changes
from toprcli.shards import read_json

# Seeds of the randomness a run draws (not of its data: dataset seeds pick other problems, few-shot seeds other prompts).
SEED_KEYS = ("warm_start.model_seed", "generate.sampling.seed", "curate.seed", "train.seed", "eval.sampling.seed", "eval.bootstrap_seed")
# The training loss is not among them: losses differ in scale and meaning (DPO starts at log 2); each run's loss.png has it.
COMPARED = (("pass@1", "pass@1"), ("maj@k", "maj@k"), ("greedy_accuracy", "greedy"), ("reward_positive_share", "correct share of the samples"),
            ("p", "p (correct share of the training rows)"), ("p_effective", "p̃ (effective positive share)"))
RATES = tuple(key for key, _ in COMPARED)  # drawn on 0..1
SHOWN_KEYS = 4  # settings named in a label; compare.md lists them all


def group_seeds(configs: list[dict[str, Any] | None], histories: list[dict[int, dict[str, Any] | None]] | None = None) -> list[list[int]]:
    """Indices of the runs by variant, in the order first given: a run joins a variant when it differs from each of its
    runs in seeds alone, and in some seed (the same config twice is a repeat, not another seed), and so did each round
    both made (``histories``: each run's round configs; a branch's rounds before its own are its parent's, so a run
    branched after a TOPR round is not another seed of one that was SFT from the start)."""
    histories = histories or [{} for _ in configs]

    def seeds_apart(i: int, j: int) -> bool:
        top, rounds = _differences(j, i, configs, histories)
        return bool(top) and top | rounds <= set(SEED_KEYS)

    groups: list[list[int]] = []
    for i, cfg in enumerate(configs):
        home = next((g for g in groups if cfg is not None and all(configs[j] is not None and seeds_apart(i, j) for j in g)), None)
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


def label(names: list[str], cfg: dict[str, Any] | None, reference: dict[str, Any] | None, rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """A variant's name (its runs') and what differs in its settings from the first variant's, and what changed on the
    way (``--apply-from-next-round``, or a branch's rounds after its parent's), each of those with the round it applies
    from (round 1 is the first trained: a change there is the run's from the start); (label, every difference)."""
    first = 1
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


def _differences(i: int, j: int, configs: list[dict[str, Any] | None],
                 histories: list[dict[int, dict[str, Any] | None]]) -> tuple[set[str], set[str]]:
    """The settings runs ``i`` and ``j`` differ in: (in their configs, in any round both made)."""
    rounds = {k for r in histories[i].keys() & histories[j].keys() for k in setting_changes(histories[i][r], histories[j][r])}
    return set(setting_changes(configs[i], configs[j])), rounds


def _same_history(i: int, j: int, configs: list[dict[str, Any] | None], histories: list[dict[int, dict[str, Any] | None]]) -> bool:
    """Runs ``i`` and ``j`` have the same settings, seeds too, at the top and in every round both made: a repeat."""
    return None not in (configs[i], configs[j]) and not any(_differences(i, j, configs, histories))


def made_by(run_dir: Path, r: int) -> str:
    """The run that made round ``r`` of ``run_dir``: itself, or, for a round a branch took from its parent, the parent's
    maker (its copies are one measurement, not one per branch)."""
    lin = lineage(run_dir)
    if lin is not None and r <= lin["round"]:
        return made_by(Path(lin["parent"]), r)
    return str(Path(run_dir).resolve())


def _mean_rows(runs: list[dict[str, Any]], makers: list[dict[int, str]]) -> list[dict[str, Any]]:
    """Per round any run of a variant has: each compared metric's mean over its runs' measurements (a round branches
    took from one parent is one measurement), with ``spread`` (mean ± one standard deviation) and the values where
    there are several, else that one measurement's own 95% interval (the run's own rows when the variant is one run)."""
    if len(runs) == 1:
        return runs[0]["rounds"]
    by_round = [{r["round"]: r for r in run["rounds"]} for run in runs]
    out = []
    for rnd in sorted(set.union(*(set(b) for b in by_round))):
        row: dict[str, Any] = {"round": rnd, "intervals": {}, "spread": {}, "seeds": {}}
        for key, _ in COMPARED:
            measured: dict[str, dict[str, Any]] = {}
            for b, maker in zip(by_round, makers):
                if rnd in b and b[rnd].get(key) is not None:
                    measured.setdefault(maker[rnd], b[rnd])
            values = [m[key] for m in measured.values()]
            if len(values) == 1:
                row[key] = values[0]
                if (interval := (next(iter(measured.values())).get("intervals") or {}).get(key)) is not None:
                    row["intervals"][key] = interval
            elif values:
                mean, sd = statistics.fmean(values), statistics.stdev(values)
                row[key], row["spread"][key], row["seeds"][key] = mean, [mean - sd, mean + sd], {"mean": mean, "std": sd, "values": values}
        out.append(row)
    return out


def variants(dirs: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(runs, variants): every run's rounds and label, and the runs grouped by seed with their compared round."""
    configs, names = [recorded_config(d) for d in dirs], run_names(dirs)
    runs = [{"run_dir": str(d), "name": n, "lineage": lineage(d), "rounds": collect(d)} for d, n in zip(dirs, names)]
    histories = [{r["round"]: recorded_config(round_dir(d, r["round"])) for r in run["rounds"]} for d, run in zip(dirs, runs)]
    makers = [{r["round"]: made_by(d, r["round"]) for r in run["rounds"]} for d, run in zip(dirs, runs)]
    out: list[dict[str, Any]] = []
    for group in group_seeds(configs, histories):
        members = [runs[i] for i in group]
        text, keys = label([m["name"] for m in members], configs[group[0]], configs[0] if out else None, members[0]["rounds"])
        rounds = [last_evaluated(m["rounds"]) for m in members]
        series = _mean_rows(members, [makers[i] for i in group])
        at = max(set.intersection(*(evaluated(m["rounds"]) for m in members)), default=min(rounds))  # the last all seeds evaluated
        final = next((r for r in series if r["round"] == at), series[-1] if series else {"round": at})
        k = next((r.get("k") for r in members[0]["rounds"] if r["round"] == at), None)
        repeats = next((names[j] for v in out for j in v["indices"] if _same_history(j, group[0], configs, histories)), None)
        for m in members:
            m["label"] = text
        out.append({"label": text, "differs": keys, "runs": [m["run_dir"] for m in members], "round": at, "k": k, "repeats": repeats,
                    "rounds_evaluated": dict(zip((m["name"] for m in members), rounds)), "final": final, "series": series, "indices": group})
    for v in out:
        del v["indices"]
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
    evals = [evals_at(g["runs"], g["round"]) for g in groups]
    for group, evs in zip(groups, evals):  # prompts the compared evals scored (a smaller limit: fewer)
        group["prompts"] = min((len(e["per_prompt"]["pass@1"]) for e in evs if "pass@1" in e.get("per_prompt", {})), default=None)
    for group, evs in zip(groups[1:], evals[1:]):
        group["paired_vs_first"] = paired_difference(evals[0], evs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.2))
    axes = grid.ravel()  # one panel per COMPARED metric
    for ax, (key, title) in zip(axes, COMPARED):
        for i, group in enumerate(groups):
            plot_series(ax, group["series"], key, group["label"], color=f"C{i % 10}", bars=("spread", "intervals"))  # one colour a variant
        ax.set(xlabel="round", title=title, **({"ylim": (0, 1)} if key in RATES else {}))  # p̃ 0.4999999 and 0.5 are one value
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.025), ncol=min(len(groups), 3), fontsize="small")
    fig.text(0.01, 0.005, "bars: a variant of several seeds, ± 1 standard deviation over its seeds; one measurement, its 95% bootstrap "
             "interval over prompts", fontsize="x-small", color="0.35")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)
    (out / "compare.md").write_text(comparison_markdown(groups, runs))
    return {"runs": runs, "variants": groups}, out


def final_rows(groups: list[dict[str, Any]]) -> list[list[Any]]:
    """Metric × variant, at each variant's compared round: a measurement, or a variant's mean ± standard deviation over
    its seeds, to 3 decimals; maj@k named by its k (each cell's, where variants differ)."""
    ks = {g.get("k") for g in groups}

    def cell(group: dict[str, Any], key: str) -> Any:
        seeds, value = (group["final"].get("seeds") or {}).get(key), group["final"].get(key)
        text = f"{seeds['mean']:.3f} ± {seeds['std']:.3f}" if seeds else f"{value:.3f}" if isinstance(value, float) else value
        return f"{text} (maj@{group['k']})" if key == "maj@k" and len(ks) > 1 and text is not None and group.get("k") else text

    def title(key: str, text: str) -> str:
        return f"maj@{next(iter(ks))}" if key == "maj@k" and len(ks) == 1 and None not in ks else text

    return [["round", *[g["round"] for g in groups]], *[[title(key, text), *[cell(g, key) for g in groups]] for key, text in COMPARED]]


def notes(groups: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """What the table alone does not say, a sentence each: the seeds, rounds compared, runs behind the others, branches,
    repeats, every difference in settings, and each variant's paired difference with the first."""
    lines = []
    for g in (g for g in groups if len(g["runs"]) > 1):
        lines.append(f"{g['label']}: mean ± standard deviation over {len(g['runs'])} seeds ({', '.join(g['rounds_evaluated'])}).")
    rounds = {g["label"]: g["round"] for g in groups}
    if len(set(rounds.values())) > 1:
        lines.append("compared at their last evaluated rounds, which differ: " + ", ".join(f"{k} round {v}" for k, v in rounds.items()) + ".")
    for g in groups:
        evaluated_to = g["rounds_evaluated"]
        if len(set(evaluated_to.values())) > 1:
            holding = [name for name, r in evaluated_to.items() if r <= g["round"]]
            lines.append(f"{g['label']}: its runs were evaluated to different rounds ({', '.join(f'{k} {v}' for k, v in evaluated_to.items())}): "
                         f"compared at round {g['round']}, the last all have; its curve after that is the mean of the runs that have each "
                         f"round — finish {', '.join(holding)} (its `topr iterate` resumes it), or leave {'it' if len(holding) == 1 else 'them'} out.")
        if len(g["differs"]) > SHOWN_KEYS:
            lines.append(f"{g['label']} differs from {groups[0]['label']} in: {', '.join(g['differs'])}.")
        if g.get("repeats"):
            lines.append(f"{g['label']} has the settings of {g['repeats']}, seeds included: a repeat, compared as a variant of its own.")
    lines += [f"{run['name']}: branched from {run['lineage']['parent']} at round {run['lineage']['round']}." for run in runs if run["lineage"]]
    for g in groups[1:]:
        lines += _paired_notes(g, groups[0])
    return lines


def _paired_notes(g: dict[str, Any], first: dict[str, Any]) -> list[str]:
    """``g``'s paired difference with the first variant, a sentence a metric; or why there is none."""
    paired = g.get("paired_vs_first")
    if paired is None:
        return [f"{g['label']} and {first['label']}: no paired difference (an eval at a compared round is missing, or has no per-prompt scores)."]
    if paired.get("not_comparable"):
        return [f"{g['label']} and {first['label']} were evaluated differently ({', '.join(paired['not_comparable'])}): no paired difference."]
    lines, ra, rb = [], *paired["rounds"]
    for key, d in ((k, d) for k, d in paired.items() if isinstance(d, dict) and "interval" in d):
        lines.append(f"{g['label']} (round {rb}) − {first['label']} (round {ra}), {key}: {d['difference']:+.3f} "
                     f"[{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}] over {d['prompts']} shared prompts (paired bootstrap): "
                     f"{'outside' if d['outside_noise'] else 'within'} the noise.")
    shared = next((d["prompts"] for d in paired.values() if isinstance(d, dict) and "prompts" in d), None)
    if shared is not None and shared < max(g.get("prompts") or 0, first.get("prompts") or 0):
        lines.append(f"{g['label']} was evaluated on {g['prompts']} prompts and {first['label']} on {first['prompts']}: the table's values "
                     f"are over different prompts; the paired difference is over the {shared} both have.")
    return lines


def comparison_markdown(groups: list[dict[str, Any]], runs: list[dict[str, Any]] | None = None) -> str:
    head = ["metric", *[g["label"] for g in groups]]
    lines = ["# Runs compared", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in final_rows(groups)]
    for note in notes(groups, runs or []):
        lines += ["", note]
    return "\n".join(lines + ["", "Plot: `compare.png`.", ""])
