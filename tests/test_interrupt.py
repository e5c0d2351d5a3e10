"""SIGINT/SIGTERM/SIGHUP inside and outside a deferred section (toprcli.interrupt), in this process."""

from __future__ import annotations

import os
import signal

import pytest

from toprcli import interrupt


@pytest.fixture
def installed():
    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    interrupt.reset()
    interrupt.install()
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
    interrupt.reset()


def test_a_signal_outside_a_deferred_section_stops_at_once(installed):
    with pytest.raises(interrupt.Interrupted) as e:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000_000):  # the handler runs between bytecodes
            pass
    assert (e.value.name, e.value.exit_code) == ("SIGINT", 130)


def test_deferred_records_the_first_signal_and_a_second_stops_at_once(installed):
    steps = 0
    with pytest.raises(interrupt.Interrupted) as e:
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(3):  # the loop runs on to its boundary
                steps += 1
            assert interrupt.requested() == signal.SIGTERM
    assert steps == 3 and e.value.exit_code == 143 and "stopped after finishing" in str(e.value)  # raised on leaving
    interrupt.reset()
    with pytest.raises(interrupt.Interrupted):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # insisted: no waiting for the boundary
            for _ in range(10_000_000):
                pass
            pytest.fail("the second signal did not stop the section")


def test_without_install_nothing_changes():
    assert interrupt.requested() is None
    with interrupt.deferred():
        pass  # no signal, no raise


def test_sighup_stops_like_sigterm_unless_it_was_ignored_as_nohup_does():
    import subprocess
    import sys

    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a script's `cmd &` inherits: topr still stops on it, as before
        interrupt.install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal: the hang-up stops at a safe point, exit 129
        interrupt.reset()
        interrupt.install()
        with pytest.raises(interrupt.Interrupted) as e:
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGHUP)
                assert interrupt.requested() == signal.SIGHUP
        assert e.value.exit_code == 129
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        interrupt.reset()
    # A signal outside every command's handler (typer parsing, teardown) is one line and 130, not a traceback.
    code = ("import toprcli.cli.main as m\nfrom toprcli.interrupt import Interrupted\n"
            "def app(**kw):\n    raise Interrupted(2)\nm.app = app\nm.main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 130 and done.stderr.strip() == "interrupted by SIGINT", done.stderr


def test_a_stop_ends_what_it_stopped_and_the_next_section_starts_afresh(installed):
    """In a notebook (install() once, several runs): after one Ctrl-C, every later training raised "stopped before step
    1" with no signal sent, as the recorded signal was never forgotten."""
    with pytest.raises(interrupt.Interrupted):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            with interrupt.deferred():  # a nested section (a stage in a pipeline) keeps what its outer one recorded
                assert interrupt.requested() == signal.SIGINT
    with interrupt.deferred():
        assert interrupt.requested() is None  # the next run is not stopped by the last one's signal
