"""The verifier pool: real worker processes, hard per-check limits, crashes, order, cleanup."""

from __future__ import annotations

import os
import time

import pytest

from builders import gsm8k_rows, shifted_pairs
from toprcli.errors import UserError
from toprcli.verifiers import VerifierPool

PLUGIN = """
import ctypes, os, time

def check(completion, answer, row):
    if completion == "sleep":
        time.sleep(600)
    if completion == "spin":
        while True:
            pass
    if completion == "exit":
        os._exit(3)
    if completion == "segv":
        ctypes.string_at(0)
    if completion == "raise":
        raise KeyError("boom")
    if completion == "base":
        raise KeyboardInterrupt  # not an Exception
    if completion == "mem":
        return len(bytearray(10**12)) > 0
    if completion == "row":
        return row["prompt_id"] == "p7"
    if completion == "float":
        return 0.25
    if completion in ("child", "session"):  # a check that starts a process (in a session of its own: a sandbox's), then hangs
        import subprocess
        proc = subprocess.Popen(["sleep", "600"], start_new_session=completion == "session")
        with open(completion + ".pid", "w") as f:
            f.write(str(proc.pid))
        time.sleep(600)
    return completion == answer
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "poolplug.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def alive(pids):
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        try:  # a zombie waiting to be reaped is not running anything
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    continue
        except OSError:
            continue
        out.append(pid)
    return out


def test_gsm8k_pool_matches_dataset_and_keeps_order():
    rows = gsm8k_rows()
    with VerifierPool("gsm8k", workers=2, timeout=5) as pool:
        got = pool.map([r["answer"] for r in rows], [r["answer"] for r in rows])
        assert [v.verdict for v in got] == ["correct"] * 1319
        pairs = shifted_pairs(rows)
        wrong = pool.map([c for c, _ in pairs], [a for _, a in pairs])
        assert all(v.verdict == "incorrect" for v in wrong)
        # order: alternate right and wrong answers
        mixed = pool.map(
            [r["answer"] for r in rows], [r["answer"] if i % 2 else a for i, (r, (_, a)) in enumerate(zip(rows, pairs))]
        )
        assert [v.verdict for v in mixed] == ["incorrect" if i % 2 == 0 else "correct" for i in range(1319)]
        assert pool.stats["timeouts"] == 0


def test_hangs_crashes_and_exceptions_do_not_stop_the_run(plugin_dir):
    completions = ["a", "sleep", "b", "exit", "a", "segv", "raise", "base", "mem", "spin", "row", "float", "a"]
    rows = [{"prompt_id": "p7"}] * len(completions)
    t = time.perf_counter()
    with VerifierPool("python:poolplug:check", workers=2, timeout=2.0, chunk_size=4) as pool:
        got = pool.map(completions, ["a"] * len(completions), rows)
        pids = [w.proc.pid for w in pool._workers]
        assert len(alive(pids)) == 2  # replacements are up
        assert pool.check("a", "a", {"prompt_id": "x"}).verdict == "correct"  # the pool still works
    elapsed = time.perf_counter() - t
    expected = {
        "a": "correct",
        "sleep": "timeout",
        "b": "incorrect",
        "exit": "error",
        "segv": "error",
        "raise": "error",
        "base": "error",
        "mem": "error",
        "spin": "timeout",
        "row": "correct",
        "float": "correct",
    }
    assert [v.verdict for v in got] == [expected[c] for c in completions], got
    details = {c: v.detail for c, v in zip(completions, got)}
    assert "exit code 3" in details["exit"] and "SIGSEGV" in details["segv"], details
    assert "KeyError" in details["raise"] and "MemoryError" in details["mem"]
    assert got[completions.index("float")].score == 0.25
    assert pool.stats["timeouts"] == 2
    assert elapsed < 20
    assert not alive(pids)  # closing leaves nothing behind


def test_time_limit_is_per_check_not_per_chunk(plugin_dir):
    """Many quick rows in one chunk are fine; only the stuck row is blamed, near the limit."""
    completions = ["a"] * 300 + ["sleep"] + ["a"] * 300
    with VerifierPool("python:poolplug:check", workers=1, timeout=1.0, chunk_size=1000) as pool:
        t = time.perf_counter()
        got = pool.map(completions, ["a"] * len(completions))
        elapsed = time.perf_counter() - t
    assert [v.verdict for v in got].count("timeout") == 1 and got[300].verdict == "timeout"
    assert all(v.verdict == "correct" for i, v in enumerate(got) if i != 300)
    assert 1.0 <= elapsed < 6.0


@pytest.mark.parametrize("how", ["child", "session"])
def test_a_worker_killed_at_its_deadline_takes_the_processes_its_check_started(plugin_dir, how):
    """The worker was killed alone: a plugin's subprocess was reparented to init and kept running. Killing the worker's
    group took those in it, not one in a session of its own (a sandboxed code reward's), which piled up until the end."""
    with VerifierPool("python:poolplug:check", workers=1, timeout=1.0) as pool:
        got = pool.map([how, "a"], ["a", "a"])
        assert [v.verdict for v in got] == ["timeout", "correct"]
        child = int((plugin_dir / f"{how}.pid").read_text())
        deadline = time.monotonic() + 5
        while alive([child]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive([child])  # gone while the pool still runs, not only when the command exits


ADVERSARIAL = {
    "python in box": "\\boxed{__import__('os').system('touch pwned_box')}",
    "python in text": "The answer is __import__('os').system('touch pwned_text')",
    "eval in text": "answer: eval(chr(49))",
    "10^5 chars boxed": "\\boxed{" + "1" * 100_000 + "}",
    "10^5 chars text": "12 " * 33_333,
    "10^5 chars latex": "$x$ " * 25_000,
    "500-deep fractions": "\\boxed{" + "\\frac{1}{" * 500 + "2" + "}" * 500 + "}",
    "tower": "\\boxed{9^{9^9}}",
    "tower unboxed": "The final answer is 9^9^9",
    "tower 2": "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "1E999999999": "\\boxed{1E999999999}",
    "1E999999": "\\boxed{1E999999}",
    "huge factorial": "\\boxed{100000000!}",
    "computed factorial": "\\boxed{(10^{9})!}",
    "huge binomial": "\\boxed{\\binom{10^{8}}{5 \\cdot 10^{7}}}",
}


def test_math_adversarial_completions_end_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = list(ADVERSARIAL)
    t = time.perf_counter()
    with VerifierPool("math", workers=2, timeout=2.0) as pool:
        got = pool.map([ADVERSARIAL[n] for n in names] + ["\\boxed{\\frac{1}{2}}"], ["2"] * len(names) + ["0.5"])
    elapsed = time.perf_counter() - t
    by = dict(zip(names, got))
    for name in names:
        assert by[name].verdict in ("timeout", "error", "incorrect", "no_answer"), (name, by[name])
    assert got[-1].verdict == "correct"  # and real work still gets done
    assert not list(tmp_path.iterdir()), "model text was executed"
    # Screened cheaply rather than burning the time limit:
    for name in (
        "tower",
        "tower unboxed",
        "1E999999999",
        "1E999999",
        "huge factorial",
        "computed factorial",
        "500-deep fractions",
    ):
        assert by[name].verdict == "incorrect" and "rejected" in by[name].detail, (name, by[name])
    assert elapsed < 30


def test_plugin_failing_in_the_worker_is_a_user_error(tmp_path, monkeypatch):
    (tmp_path / "flaky.py").write_text(
        "import os\nif os.environ.get('OMP_NUM_THREADS') == '1':\n    raise ImportError('only in workers')\n"
        "def f(c, a, r):\n    return True\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with pytest.raises(UserError, match="does not import"):
        with VerifierPool("python:flaky:f", workers=1, timeout=2):
            pass


def test_workers_slow_to_import_a_plugin_are_one_line_naming_it(tmp_path, monkeypatch):
    """A plugin whose import took past the start-up limit (a model loaded at import) was a RuntimeError traceback."""
    import toprcli.verifiers.pool as pool

    (tmp_path / "slow.py").write_text("import os, time\nif os.environ.get('OMP_NUM_THREADS') == '1':\n    time.sleep(5)\n"
                                      "def f(c, a, r):\n    return True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setattr(pool, "STARTUP_TIMEOUT", 1.0)
    with pytest.raises(UserError, match=r"verifier python:slow:f: its workers were not ready after 1 s — each worker imports it: a model"):
        with VerifierPool("python:slow:f", workers=1, timeout=2):
            pass


def test_a_memory_cap_too_small_for_the_verifier_is_one_line_naming_it(tmp_path, monkeypatch):
    """150 MiB cannot hold math-verify: a RuntimeError traceback ("exited with code None"). A plugin over the cap at
    import was told to check its PYTHONPATH."""
    with pytest.raises(UserError, match=r"verifier workers failed to start \(.+\) — if 150 MiB a worker \(worker_memory_mb\) is too little"):
        with VerifierPool("math", workers=1, timeout=5, memory_limit_mb=150):
            pass
    (tmp_path / "big.py").write_text("import os\nif os.environ.get('OMP_NUM_THREADS') == '1':\n    blob = bytearray(2 * 10**9)\n"
                                     "def f(c, a, r):\n    return True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with pytest.raises(UserError, match="ran out of memory as it imported — .*raise worker_memory_mb"):
        with VerifierPool("python:big:f", workers=1, timeout=2, memory_limit_mb=1000):
            pass


def test_empty_and_mismatched_input():
    with VerifierPool("exact", workers=1) as pool:
        assert pool.map([], []) == []
        with pytest.raises(ValueError):
            pool.map(["a"], [])
    with pytest.raises(UserError):
        VerifierPool("exact", timeout=0)
