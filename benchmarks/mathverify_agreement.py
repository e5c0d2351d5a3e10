"""Agreement with Math-Verify's own test suite: `topr score --verifier math` vs raw math-verify.

Usage:
    python benchmarks/mathverify_agreement.py MATH_VERIFY              # a checkout, or its bare git dir
    python benchmarks/mathverify_agreement.py MATH_VERIFY --show 20    # also list disagreements
    python benchmarks/mathverify_agreement.py MATH_VERIFY --write-docs # update docs/benchmarks.md

MATH_VERIFY is a checkout of github.com/huggingface/Math-Verify (its
``tests/test_all.py`` and ``tests/test_yujianll.py`` are read), or its git
directory (then the files are read from ``HEAD`` with ``git show``). Nothing of
that repository is copied here: the cases are read from its files at run time.

Cases: every ``@pytest.mark.parametrize`` of those files whose argument names
include ``gold``, ``pred`` and ``expected`` (or ``result``), read with ``ast``;
values that are not literals are skipped (counted). Each case is one samples
row, ``answer`` = gold and ``completion`` = pred.

Two scorers, one run:

* ``topr score``: the real score stage (``toprcli.stages.score.run``, what the
  CLI calls) with ``--verifier math`` on a samples Parquet file: worker pool,
  per-check deadlines, our screens. A case agrees when ``correct`` equals the
  expected verdict.
* raw: ``math_verify.verify(math_verify.parse(gold), math_verify.parse(pred))``
  in this process with the library's defaults.

The suite's own helper uses other settings in places (LaTeX-only or
expression-only extraction, boxed first, a lower float precision, set-relation
comparison), so neither scorer is expected to reach 100%.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from docs_section import write_section  # benchmarks/docs_section.py (the script's own directory)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "benchmarks.md"
FILES = ("tests/test_all.py", "tests/test_yujianll.py")
GOLD, PRED, EXPECTED = ("gold",), ("pred", "prediction"), ("expected", "result")


def read_source(repo: Path, rel: str) -> str:
    """A file of the checkout, or of ``HEAD`` when ``repo`` is a git directory."""
    if (repo / rel).is_file():
        return (repo / rel).read_text()
    if (repo / "HEAD").is_file() and (repo / "objects").is_dir():
        return subprocess.run(
            ["git", f"--git-dir={repo}", "show", f"HEAD:{rel}"], check=True, capture_output=True, text=True
        ).stdout
    raise SystemExit(f"{repo}: neither a checkout nor a git directory holding {rel}")


def revision(repo: Path) -> str:
    """The checkout's commit (short), or "unknown"."""
    git_dir = repo if (repo / "HEAD").is_file() and (repo / "objects").is_dir() else repo / ".git"
    r = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def _parametrize_calls(fn: ast.FunctionDef):
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "parametrize":
            yield dec


def _position(names: list[str], wanted: tuple[str, ...]) -> int | None:
    return next((names.index(w) for w in wanted if w in names), None)


def extract_cases(source: str, origin: str) -> tuple[list[dict], int]:
    """(cases, skipped): every literal (gold, pred, expected) row of the file's parametrized tests."""
    cases, skipped = [], 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        for call in _parametrize_calls(node):
            if len(call.args) < 2:
                continue
            try:
                argnames = ast.literal_eval(call.args[0])
            except ValueError:
                continue
            names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
            g, p, e = _position(names, GOLD), _position(names, PRED), _position(names, EXPECTED)
            if g is None or p is None or e is None or not isinstance(call.args[1], (ast.List, ast.Tuple)):
                continue
            for row in call.args[1].elts:
                try:
                    values = ast.literal_eval(row)
                except ValueError:
                    skipped += 1
                    continue
                if not isinstance(values, tuple) or len(values) != len(names):
                    skipped += 1
                    continue
                gold, pred, expected = values[g], values[p], values[e]
                if not (isinstance(gold, str) and isinstance(pred, str)):
                    skipped += 1
                    continue
                cases.append(
                    {"origin": f"{origin}::{node.name}:{row.lineno}", "gold": gold, "pred": pred, "expected": bool(expected)}
                )
    return cases, skipped


def raw_verdicts(cases: list[dict]) -> list[bool]:
    """math-verify with its defaults (its own SIGALRM timeouts: we are on the main thread)."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    out = []
    for c in cases:
        try:
            out.append(bool(verify(parse(c["gold"]), parse(c["pred"]))))
        except BaseException as e:  # its TimeoutException is a BaseException
            if isinstance(e, KeyboardInterrupt):
                raise
            out.append(False)
    return out


def topr_verdicts(cases: list[dict], workers: int | None, timeout: float) -> tuple[list[bool], list[str], list[str | None]]:
    """``topr score --verifier math`` on a samples file of the cases: (correct, verdict, extracted_answer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from toprcli import shards
    from toprcli.config import ScoreConfig
    from toprcli.stages.score import run as score

    n = len(cases)
    table = pa.table(
        {
            "prompt_id": [f"case-{i}" for i in range(n)],
            "prompt": [c["origin"] for c in cases],
            "answer": [c["gold"] for c in cases],
            "prompt_token_ids": [[1]] * n,
            "sample_index": [0] * n,
            "completion": [c["pred"] for c in cases],
            "completion_token_ids": [[1]] * n,
            "behavior_logprobs": [[0.0]] * n,
            "finish_reason": ["stop"] * n,
            "policy": ["math-verify-suite"] * n,
            "iteration": [0] * n,
        },
        schema=shards.SAMPLES_SCHEMA.with_metadata(None),
    )
    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "samples.parquet"
        pq.write_table(table, samples)
        out = Path(tmp) / "scored"
        score(ScoreConfig(samples=str(samples), out=str(out), verifier="math", workers=workers, timeout=timeout))
        scored = shards.read_table(out, columns=["prompt_id", "correct", "verdict", "extracted_answer"])
    order = {pid: i for i, pid in enumerate(scored.column("prompt_id").to_pylist())}
    idx = [order[f"case-{i}"] for i in range(n)]
    correct, verdict, extracted = (scored.column(c).to_pylist() for c in ("correct", "verdict", "extracted_answer"))
    return [correct[i] for i in idx], [verdict[i] for i in idx], [extracted[i] for i in idx]


def write_docs(text: str) -> None:
    write_section(DOC, "mathverify", text.rstrip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("math_verify", type=Path, help="a Math-Verify checkout or its git directory")
    ap.add_argument(
        "--files", default=",".join(FILES), help=f"comma-separated test files of the checkout (default {','.join(FILES)})"
    )
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--show", type=int, default=0, help="list up to this many cases where the two scorers differ")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    files = tuple(f.strip() for f in args.files.split(",") if f.strip())
    cases, skipped = [], 0
    for rel in files:
        found, skip = extract_cases(read_source(args.math_verify, rel), Path(rel).name)
        cases += found
        skipped += skip
    import math_verify

    version = getattr(math_verify, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("math-verify")
    t0 = time.perf_counter()
    raw = raw_verdicts(cases)
    t_raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours, verdicts, extracted = topr_verdicts(cases, args.workers, args.timeout)
    t_ours = time.perf_counter() - t0
    expected = [c["expected"] for c in cases]
    raw_ok = sum(r == e for r, e in zip(raw, expected))
    ours_ok = sum(o == e for o, e in zip(ours, expected))
    per_file = {}
    for rel in files:
        name = Path(rel).name
        sel = [i for i, c in enumerate(cases) if c["origin"].startswith(name + "::")]
        per_file[name] = (len(sel), sum(raw[i] == expected[i] for i in sel), sum(ours[i] == expected[i] for i in sel))
    from collections import Counter

    lines = [
        f"{len(cases)} cases ({skipped} non-literal rows skipped) from {', '.join(files)} "
        f"(Math-Verify {revision(args.math_verify)}); math-verify {version} installed.",
        f"agree with the expected verdict: topr score --verifier math {ours_ok}/{len(cases)}, "
        f"raw math-verify (defaults) {raw_ok}/{len(cases)}",
    ]
    for name, (n, r, o) in per_file.items():
        lines.append(f"  {name}: topr {o}/{n}, raw {r}/{n}")
    lines.append(f"topr verdicts: {dict(Counter(verdicts))}; time: topr {t_ours:.1f} s (pool start included), raw {t_raw:.1f} s")
    print("\n".join(lines))
    if args.show:
        diff = [i for i in range(len(cases)) if raw[i] != ours[i] or ours[i] != expected[i]]
        print(f"\n{len(diff)} cases where topr is wrong or differs from raw (first {args.show}):")
        for i in diff[: args.show]:
            c = cases[i]
            print(
                f"- {c['origin']}: expected={int(c['expected'])} topr={int(ours[i])} ({verdicts[i]}, read {extracted[i]!r}) raw={int(raw[i])}\n"
                f"    gold={c['gold']!r}\n    pred={c['pred'][:300]!r}"
            )
    if args.write_docs:
        misses = [i for i in range(len(cases)) if ours[i] != expected[i]]
        write_docs(
            "## math verifier vs Math-Verify's own test suite\n\n"
            f"`python benchmarks/mathverify_agreement.py MATH_VERIFY --write-docs`: the literal (gold, pred, expected) "
            f"cases of {', '.join(f'`{f}`' for f in files)} in Math-Verify (commit {revision(args.math_verify)}), "
            f"extracted with `ast` ({len(cases)} cases; math-verify {version} installed). Each case is a samples row (answer = gold, completion = pred) "
            "scored by the real `topr score --verifier math` path; raw = `verify(parse(gold), parse(pred))` with the "
            "library's defaults. The suite's own helper uses other settings in places (LaTeX-only extraction, boxed "
            "first, a lower float precision, set-relation comparison), so neither reaches 100%.\n\n"
            "| file | cases | topr score --verifier math | raw math-verify |\n| --- | ---: | ---: | ---: |\n"
            + "".join(f"| {name} | {n} | {o} | {r} |\n" for name, (n, r, o) in per_file.items())
            + f"| all | {len(cases)} | {ours_ok} | {raw_ok} |\n\n"
            + f"Cases `topr score` gets wrong ({len(misses)}; raw math-verify's verdict in parentheses):\n\n"
            + "".join(
                f"- `{cases[i]['origin']}`: expected {int(expected[i])}, got {int(ours[i])} (raw {int(raw[i])})\n" for i in misses
            )
        )


if __name__ == "__main__":
    main()
