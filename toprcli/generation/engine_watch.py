"""A vLLM engine that dies while it generates ends the command with one line, not a hang or a traceback.

vLLM 0.32's synchronous client waits on its output queue for good when the engine core process dies mid-request
(SIGKILL, the kernel's out-of-memory killer): its monitor thread marks the engine dead and stops the output thread,
but puts nothing on the queue (``vllm/v1/engine/core_client.py``, ``SyncMPClient``). A thread of ours watches that
mark during a request and puts vLLM's own ``EngineDeadError`` on the queue, which ``generate`` then raises; a worker
that dies (vLLM raises ``EngineDeadError`` itself) and a dead engine both become a :class:`UserError`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from toprcli.errors import UserError

POLL_S = 0.5  # how often the mark is read while a request runs


@contextlib.contextmanager
def engine_watched(llm: Any) -> Iterator[None]:
    """Around one ``llm.generate``: a dead engine raises :class:`UserError` (the finished shards are kept)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    resources, outputs = getattr(core, "resources", None), getattr(core, "outputs_queue", None)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            if getattr(resources, "engine_dead", False):
                outputs.put_nowait(EngineDeadError())  # what get_output raises: the request ends
                return

    if resources is not None and outputs is not None:  # an in-process engine (no client queue) cannot die apart from us
        threading.Thread(target=watch, name="toprcli-engine-watch", daemon=True).start()
    try:
        yield
    except EngineDeadError:
        raise UserError("the vLLM engine died while it generated (killed, or out of memory: the command's log may say) — "
                        "finished shards are kept: rerun the same command to resume") from None
    finally:
        done.set()
