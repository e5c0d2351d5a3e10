"""`topr eval`: pass@1, pass@k, maj@k, greedy accuracy and invalid rate of a policy."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from toprcli.cli.builder import Stage, lazy
from toprcli.cli.common import console, err_console, print_tracked, summary_table
from toprcli.config import EvalConfig
from toprcli.stages import StageResult

DOC = """Sample k completions per test prompt, score them, and report the metrics.

    Reports greedy accuracy, pass@1 (mean over samples), pass@k (unbiased
    estimator), maj@k (majority vote over extracted answers; ties give
    expected credit) and the invalid rate (no extractable answer). With a generative
    verifier: best-of-k by verifier score, verifier-weighted maj@k, and the verifier's
    accuracy, invalid-verdict rate and AUC on the candidates.

    Examples:
      [bold]topr eval -c configs/demo.yaml --model runs/demo/round-003/policy --out eval/r3 --iteration 3[/]   (round 3's eval, to the digit: the round seeds it)
      [bold]topr eval -m models/smollm2 -d builtin:gsm8k -o eval/smollm2 --chat-template --k 4 --limit 16[/]
      [bold]topr eval --model meta-llama/Meta-Llama-3-8B-Instruct --dataset openai/gsm8k --out eval/base --chat-template[/]
      [bold]topr eval -c configs/demo.yaml -m runs/demo/round-003/policy -o eval/v --verifier-model runs/verifier-demo/topr/round-003/policy[/]
      [bold]topr eval -c configs/verifier-demo.yaml -m runs/verifier-demo/topr/round-003/policy -o eval/judge[/]   (judges its eval.candidates)
    """


def show(result: StageResult, cfg: EvalConfig) -> None:
    from toprcli.report import with_interval

    m, k = result.summary["metrics"], cfg.k
    checked_by = result.summary.get("config", {}).get("verifier") or cfg.verifier  # what auto stood for, as eval.json records it
    rows = [("prompts", m["prompts"]), ("samples", m["samples"]), ("checked by", checked_by), ("pass@1", with_interval(m, "pass@1")),
            *([(f"pass@{k}", with_interval(m, "pass@k"))] if k > 1 else []), (f"maj@{k}", with_interval(m, "maj@k")),
            ("invalid rate", m["invalid_rate"]), ("check errors", m.get("error_rate")), ("truncated (max tokens)", m.get("truncated_rate")),
            ("mean completion tokens", m["mean_completion_tokens"])]
    if "greedy_accuracy" in m:
        rows.insert(2, ("greedy accuracy", with_interval(m, "greedy_accuracy")))
    if "bootstrap" in m:
        rows.append(("[95% interval]", f"bootstrap over prompts, {m['bootstrap']['resamples']} resamples, seed {m['bootstrap']['seed']}"))
    if "best_of_k_verifier" in m:
        k = m.get("candidates_k", k)  # --candidates: every sample each problem has there
        rows += [
            ("verifier", f"{m['verifier_model']} ({m['verifier_mode']})"),
            (f"candidates judged ({'--candidates' if cfg.candidates else 'the k samples'})", m["candidates"]),
            (f"maj@{k} of the candidates", with_interval(m, "candidates_maj@k")), (f"best-of-{k} by verifier", with_interval(m, "best_of_k_verifier")),
            (f"verifier-weighted maj@{k}", with_interval(m, "weighted_maj@k")), ("verifier accuracy", m["verifier_accuracy"]),
            ("verifier invalid-verdict rate", m["verifier_invalid_rate"]), ("verifier AUC", m["verifier_auc"]),
        ]
    console.print(summary_table(f"eval of {cfg.model}", rows))
    for rate, where in (("error_rate", "scored"), ("greedy_error_rate", "greedy/scored")):  # a missing gold, a failing plugin: counted
        if m.get(rate):  # wrong, easy to miss in the rates above
            err_console.print(f"[yellow]warning:[/] {m[rate]:.1%} of the {'greedy completions' if 'greedy' in rate else 'samples'} could not "
                              f"be checked (verifier error or timeout) and count as wrong — examples in {escape(str(Path(cfg.out) / where / '_manifest.json'))}",
                              highlight=False)
    if m.get("maj@k", 0) is None:
        err_console.print(f"note: maj@{k} is not measured — the verifier ({checked_by}) extracts no answers to vote on", highlight=False, markup=False)
    console.print(f"{'already evaluated (same model and settings):' if result.skipped else 'wrote'} {Path(cfg.out) / 'eval.json'}", highlight=False, markup=False)  # paths: [v1] is text
    print_tracked(cfg.out, cfg.tracking.report_to)


STAGE = Stage("eval", EvalConfig, lazy("toprcli.launch:run_eval"), show, DOC)
