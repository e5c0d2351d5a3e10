"""No orphans, graceful stops, quiet output: real `topr` processes, real vLLM engines, real signals.

A command is started as a user would (``python -m toprcli ...``, its own process), its
descendants are recorded from /proc once the vLLM engine is up, then it is killed. None of
those processes may outlive it by more than a few seconds, whatever the signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from toprcli.processes import SCRATCH_PREFIX, descendants

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ENGINE_UP_S = 240  # an engine start takes 20-60 s on 2 busy cores
GONE_WITHIN_S = 15
# What other libraries print when a model loads (vLLM in the engine's processes, torch's NUMA notice).
NOISE = ("Triton is installed", "Loading safetensors checkpoint shards", "NUMA binding")


def start(args: list[str], logs: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen(
        [sys.executable, "-m", "toprcli", *args], env=env, stdin=subprocess.DEVNULL,
        stdout=open(logs / f"{name}.out", "wb"), stderr=open(logs / f"{name}.err", "wb"),
    )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_for_engine(proc: subprocess.Popen, out: Path, what: str) -> dict[int, int]:
    """Wait until ``proc``'s vLLM engine has written a shard below ``out`` (the engine is up and
    sampling); returns ``proc``'s descendants then."""
    deadline = time.monotonic() + ENGINE_UP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} ended (exit {proc.returncode}) before its engine was up"
        if any(out.rglob("shard-*.parquet")):
            below = descendants(proc.pid)
            assert any("VLLM::" in _cmdline(p) for p in below), f"{what}: no vLLM engine process"
            return below
        time.sleep(0.5)
    raise AssertionError(f"{what}: no shard written after {ENGINE_UP_S} s")


def rss_mib(pids) -> float:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def alive(recorded: dict[int, int]) -> list[str]:
    """The recorded processes still running (same pid and start time)."""
    out = []
    for pid, start_time in recorded.items():
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[19]) == start_time:
            out.append(f"{pid} {_cmdline(pid)[:80]}")
    return out


def assert_all_gone(recorded: dict[int, int], what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while alive(recorded) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = alive(recorded)
    assert not left, f"{what}: {len(left)} processes alive {GONE_WITHIN_S} s after the kill: {left}"


def scratch_of(pid: int) -> list[Path]:
    """The command's own temporary directory, where its vLLM engine keeps its sockets."""
    return list(Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}{pid}-*"))


@pytest.fixture
def commands(tiny_model_dir, tmp_path) -> dict[str, list[str]]:
    """`topr generate` (vLLM) and `topr iterate` (vLLM, no warm start), long enough to be killed mid-run."""
    m = str(tiny_model_dir)  # each engine's default KV cache: what the tiny model can fill, 384 MiB
    return {
        "generate": ["generate", "-m", m, "-d", "builtin:arith", "--limit", "2000", "--n", "16", "--max-new-tokens", "48",
                     "--backend", "vllm", "--shard-size", "4", "-o", str(tmp_path / "samples")],
        "iterate": ["iterate", "-c", str(REPO / "configs" / "demo.yaml"), "--run-dir", str(tmp_path / "run"), "--set", f"model={m}",
                    "--set", "warm_start.enabled=false", "--set", "generate.engine.backend=vllm", "--set", "eval.shard_size=4",
                    "--set", "eval.engine.backend=vllm"],
    }


OUTS = {"generate": "samples", "iterate": "run"}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_command_leaves_no_process(commands, tmp_path, sig):
    """generate and iterate run side by side; each is killed once its engine is up; 15 s later nothing
    of either is left, not even the sockets of its engine. SIGTERM also exits 143 with one line saying how to resume.

    The same runs check where other libraries' output goes: generate runs quietly in the SIGTERM case
    (the engine's banners and loading bars go to `<out>.log`, not the terminal) and with --verbose in
    the SIGKILL case (they show, and no log is written)."""
    verbose = sig == signal.SIGKILL
    commands["generate"] += ["--verbose"] if verbose else []
    procs = {name: start(args, tmp_path, name) for name, args in commands.items()}
    try:
        recorded = {name: wait_for_engine(p, tmp_path / OUTS[name], name) for name, p in procs.items()}
        for name, p in procs.items():
            scratch = scratch_of(p.pid)  # vLLM's sockets are there, not loose in the temporary directory
            assert len(scratch) == 1 and any(f.is_socket() for f in scratch[0].iterdir()), f"{name}: {scratch}"
            mib = rss_mib(recorded[name])
            print(f"{name}: {len(recorded[name])} descendants, {mib:.0f} MiB RSS before {sig.name}")
            p.send_signal(sig)
        for name, p in procs.items():
            code = p.wait(timeout=120)
            if sig == signal.SIGTERM:
                err = (tmp_path / f"{name}.err").read_text()
                last = [ln for ln in err.splitlines() if ln.strip()][-1]
                assert code == 143, err[-2000:]
                assert last.startswith("interrupted by SIGTERM") and "rerun the same command" in last, err[-2000:]
                assert "Traceback" not in err, err[-2000:]
        for name, p in procs.items():
            assert_all_gone(recorded[name], f"{name} after {sig.name}")
            assert not scratch_of(p.pid), f"{name}: its sockets' directory outlived it"  # the watchdog removed it
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    terminal = (tmp_path / "generate.err").read_text() + (tmp_path / "generate.out").read_text()
    log = tmp_path / "samples.log"
    if verbose:
        assert all(n in terminal for n in NOISE[:2]) and not log.exists(), terminal[-3000:]
    else:
        assert not [n for n in NOISE if n in terminal], terminal[-3000:]
        assert all(n in log.read_text() for n in NOISE[:2])


def test_sigterm_stops_training_at_a_step_and_it_resumes_there(tiny_model_dir, tmp_path):
    from builders import write_curated

    data = write_curated(tmp_path / "train.parquet", n=48)
    out = tmp_path / "policy"
    args = ["train", "-m", str(tiny_model_dir), "-d", str(data), "-o", str(out), "--optimizer", "adamw", "--lr", "1e-3",
            "--batch-size", "4", "--max-steps", "200", "--no-progress"]
    proc = start(args, tmp_path, "train")
    metrics = out.with_name("policy.partial") / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (not metrics.exists() or len(metrics.read_text().splitlines()) < 5) and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "train.err").read_text()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    err = (tmp_path / "train.err").read_text()
    assert "interrupted by SIGTERM" in err and "--resume" in err, err
    (ckpt,) = list((out.with_name("policy.partial") / "checkpoints").iterdir())
    stopped = int(ckpt.name.split("-")[1])
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, stopped + 1)), "every step up to the checkpoint is logged once"

    resumed = subprocess.run([sys.executable, "-m", "toprcli", *args, "--resume", "--json"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["resumed_from_step"] == stopped and summary["steps"] == 200
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 201)), "nothing lost, nothing logged twice"


def test_a_scratch_dir_outlives_no_owner():
    """A process killed outright (no watchdog: a Python program, not `topr`) leaves its scratch dir; the
    next process that makes one removes it, and keeps a live process's. A normal exit removes its own."""
    tmp_path = Path(tempfile.mkdtemp(prefix="tk", dir="/tmp"))  # short: pytest's tmp_path is too long for socket paths
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    code = "import sys, time; from toprcli.processes import scratch_dir; print(scratch_dir(), flush=True); time.sleep({})"
    killed = subprocess.Popen([sys.executable, "-c", code.format(60)], env=env, stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", code.format(60)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        dirs = [Path(p.stdout.readline().strip()) for p in (killed, live)]
        assert all(d.is_dir() and d.parent == tmp_path for d in dirs)
        killed.kill()
        killed.wait()
        exited = subprocess.run([sys.executable, "-c", code.format(0)], env=env, capture_output=True, text=True, check=True)
        assert not dirs[0].exists() and dirs[1].is_dir()  # the orphan went, the live one stays
        assert not Path(exited.stdout.strip()).exists()  # removed at exit
    finally:
        live.kill()
        live.wait()
        shutil.rmtree(tmp_path)


def test_a_command_that_logged_nothing_leaves_no_empty_log(tmp_path):
    """Every successful command left an empty <out>.log beside its output (only a failure removed it)."""
    done = subprocess.run([sys.executable, "-m", "toprcli", "init-model", str(tmp_path / "models" / "t")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["t"]


@pytest.mark.parametrize("error", ["RuntimeError('a bug')", "UserError('the scorer ran out of disk')"])
def test_how_a_command_ended_is_kept_in_its_log(tmp_path, error):
    """A long run's error line and a bug's traceback went to the terminal only: its log, in the run's directory, held the
    other libraries' messages up to the end and not how it ended. Both go to the log too, stamped with time and command."""
    code = f"""
import sys
import toprcli.stages.score as stage
from toprcli.errors import UserError
def run(*a, **k):
    print("other libraries' noise", file=sys.stderr, flush=True)
    raise {error}
stage.run = run
sys.argv = ["topr", "score", "-s", {str(tmp_path / "samples")!r}, "-o", {str(tmp_path / "scored")!r}]
from toprcli.cli.main import main
main()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    log = (tmp_path / "scored.log").read_text()
    assert log.startswith("other libraries' noise") and f"topr score -s {tmp_path / 'samples'}" in log
    if error.startswith("RuntimeError"):
        assert done.returncode == 1 and "RuntimeError: a bug" in done.stderr  # the traceback on the terminal ...
        assert log.rstrip().endswith("RuntimeError: a bug") and "Traceback (most recent call last)" in log  # ... and in the log
    else:
        assert done.returncode == 2 and done.stderr.startswith("error: the scorer ran out of disk (other libraries' messages:")
        assert log.rstrip().endswith("error: the scorer ran out of disk")


def test_a_command_refused_a_runs_lock_leaves_the_runs_log(tmp_path):
    """A second `topr iterate` on a live run is refused its lock; on the way out it removed the run's topr.log, still empty
    and open in the live run, whose later messages (a crash's cause) then went to a deleted file; a log with messages got
    the refused command's error line, and the refusal named the live run's log as its own."""
    from builders import MICRO_PIPELINE
    from toprcli.shards import output_lock

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "c.yaml").write_text(MICRO_PIPELINE.format(run_dir=run))
    log = run / "topr.log"
    for held in ("", "vLLM: engine started\n"):  # the live run's log: nothing written yet, then its messages
        log.write_text(held)
        with output_lock(run):  # the live run
            refused = subprocess.run([sys.executable, "-m", "toprcli", "iterate", "-c", str(tmp_path / "c.yaml")], capture_output=True,
                                     text=True, timeout=300, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        assert refused.returncode == 2 and "is being written by" in refused.stderr, refused.stderr
        assert log.is_file() and "error" not in log.read_text() and str(log) not in refused.stderr  # not its log: not told of it


@pytest.mark.parametrize("bars", ["--progress", "--no-progress"])
def test_a_terminal_that_hangs_up_ends_the_command_with_129(tiny_model_dir, tmp_path, bars):
    """A closed ssh session: the command's terminal (a pty here) goes away, SIGHUP arrives, and every later write to the
    terminal fails with EIO. The interrupted line (or the bar's last refresh) was a traceback and exit 1; now 129."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def own_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        # A login shell's SIGHUP: a suite run under nohup passes it on ignored, and topr keeps an ignored SIGHUP ignored
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    out = tmp_path / "samples"
    args = ["generate", "-m", str(tiny_model_dir), "-d", "builtin:arith", "--limit", "40", "--n", "4", "--max-new-tokens", "64", "--backend", "hf",
            "--batch-size", "2", "--shard-size", "2", "-o", str(out), bars]
    proc = subprocess.Popen([sys.executable, "-m", "toprcli", *args], stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal,
                            cwd=REPO, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    os.close(slave)
    deadline = time.monotonic() + 120
    while not list(out.glob("shard-*.parquet")) and time.monotonic() < deadline:  # generating: the hang-up comes mid-run
        assert proc.poll() is None
        if select.select([master], [], [], 0.1)[0]:  # keep the pty drained: a full one would block the command's writes
            with contextlib.suppress(OSError):
                os.read(master, 65536)
    os.close(master)  # hang up
    assert proc.wait(timeout=60) == 129
    resumed = subprocess.run([sys.executable, "-m", "toprcli", *args, "--json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr  # the shards it wrote are kept and the rest generated
