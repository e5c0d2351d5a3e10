"""One copy of the training set per machine under torchrun, not one per rank.

Every rank used to read the curated set into its own arrays (8 ranks: 8 copies, ~37 GB each for 1M rows of 4.6k
tokens). Now local rank 0 reads it and writes its flat arrays once as ``.npy`` files into a directory of the machine's
temp dir (``TMPDIR``); every local rank, rank 0 too, maps them read-only (``np.load(mmap_mode="r")``): the page cache
holds one copy for the machine (on a disk-backed TMPDIR it can page it out; a tmpfs /tmp is RAM).

This runs in ``prepare``, before any process group exists, so the ranks meet through the files: the others wait for
``complete``, or for ``failed`` (rank 0's error, raised on every rank). Where the arrays would not fit (the temp dir's
free space is checked first) each rank reads the set itself, as before, with a warning. Local rank 0 removes the
directory once the process group is up (every rank has mapped it by then: a kill later leaves nothing); a job killed
before that leaves it to the next one on the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from toprcli.errors import UserError
from toprcli.shards import write_text_atomic
from toprcli.training.batching import TokenData

PREFIX = "topr-data-"
FIELDS = tuple(f.name for f in dataclasses.fields(TokenData))
WAIT_S = 3600.0  # as long as a collective may wait: rank 0 may be reading a large set from a slow filesystem
FALLBACK = "fallback"  # the failed file's word for "read it yourself"


def local_ranks() -> tuple[int, int]:
    """(this process's local rank, the ranks on this machine) as torchrun sets them; (0, 1) alone."""
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def directory(out: Path, data_fingerprint: str) -> Path:
    """Where this attempt's ranks on this machine share the set: by the output, the data's files, the launch, the
    attempt (a torchrun restart or a Slurm requeue keeps the launch's names: its ranks' parent, the agent, is new) and
    the machine (a TMPDIR on a shared filesystem: each machine its own)."""
    launch = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
                                              "SLURM_JOB_ID", "SLURM_RESTART_COUNT")]
    key = "\0".join([str(Path(out).resolve()), data_fingerprint, *launch, str(os.getppid()), socket.gethostname()])
    return Path(tempfile.gettempdir()) / f"{PREFIX}{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def shared_on_node(load: Callable[[], TokenData], where: Path) -> TokenData:
    """``load()``'s arrays, read once per machine and mapped by every local rank; ``load()`` itself alone."""
    local_rank, local_world = local_ranks()
    if local_world <= 1:
        return load()
    if local_rank == 0:
        data = _write(where, load)
        if data is not None:  # not written: this rank keeps what it read, the others read their own
            return data
    return _mapped(where, load)


def _write(where: Path, load: Callable[[], TokenData]) -> TokenData | None:
    """Local rank 0: the arrays into ``where`` (private to this user); what it read when they cannot be written (no room:
    checked before writing, so the temp dir is never filled), else None."""
    _remove_orphans()
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        data = load()
    except BaseException as e:  # the others raise it too, instead of waiting for arrays that will not come
        _fail(where, f"error: {e}")
        raise
    size = sum(getattr(data, name).nbytes for name in FIELDS)
    try:
        if shutil.disk_usage(where.parent).free < size * 1.1 + 2**28:
            raise OSError(errno.ENOSPC, f"{size / 2**30:.1f} GiB needed")
        tmp.mkdir(mode=0o700, parents=True)
        (tmp / "owner").write_text(_owner())  # first: a kill while writing leaves a directory the next job removes
        for name in FIELDS:
            np.save(tmp / f"{name}.npy", getattr(data, name))
        shutil.rmtree(where, ignore_errors=True)
        os.replace(tmp, where)
        (where / "complete").touch()
    except OSError as e:  # a temp dir too small for the set: each rank holds its own copy, as before
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"cannot share the training set between this machine's ranks in {where.parent} ({e.strerror}): each rank "
                      "reads its own copy — point TMPDIR at a directory with room for it", stacklevel=2)
        _fail(where, FALLBACK)
        return data
    del data
    import pyarrow as pa

    pa.default_memory_pool().release_unused()  # what reading the Parquet columns took, back to the machine
    return None


def _fail(where: Path, why: str) -> None:
    with contextlib.suppress(OSError):
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        (where / "owner").write_text(_owner())
        write_text_atomic(where / "failed", why)  # a waiter reads all of it or nothing


def _owner() -> str:
    """Local rank 0, whose the directory is: pid, host and pid namespace (containers sharing a temp dir)."""
    return f"{os.getpid()} {socket.gethostname()} {_pid_namespace()}"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _mapped(where: Path, load: Callable[[], TokenData]) -> TokenData:
    """The arrays local rank 0 wrote, mapped read-only, once they are complete."""
    deadline = time.monotonic() + WAIT_S
    while not (where / "complete").is_file():
        failed = where / "failed"
        if failed.is_file():
            why = failed.read_text()
            if why == FALLBACK:
                return load()
            raise UserError(f"local rank 0 could not read the training set — {why.removeprefix('error: ')}")
        if time.monotonic() > deadline:
            raise UserError(f"local rank 0 did not write the training set into {where} within {WAIT_S:.0f} s — check its log")
        time.sleep(0.1)
    if where.stat().st_uid != os.getuid():  # a name in a shared temp dir: another user's arrays are not our training set
        raise UserError(f"{where} belongs to another user — point TMPDIR at a directory of your own")
    return TokenData(**{name: np.load(where / f"{name}.npy", mmap_mode="r") for name in FIELDS})


def remove(where: Path) -> None:
    """Local rank 0, once every rank has mapped the files (or the training ended): they go, and a kill later leaves
    nothing (a mapping keeps its pages until the process exits)."""
    if local_ranks()[0] == 0:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def removed_after(where: Path) -> Iterator[None]:
    """Local rank 0 removes ``where`` when the block ends, however (refused the output's lock, a process group that
    would not form): a compute node's temp dir may see no other job to remove it."""
    try:
        yield
    finally:
        remove(where)


def _remove_orphans() -> None:
    """The directories of jobs killed on this machine (their local rank 0 is gone; another host's or another pid
    namespace's, sharing the temp dir, are not ours to judge)."""
    for entry in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            pid, host, namespace = ((entry / "owner").read_text().split(" ", 2) + ["", ""])[:3]
            if (host, namespace) == (socket.gethostname(), _pid_namespace()) and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(entry, ignore_errors=True)
