"""One copy of the training set per machine under torchrun, not one per rank.

Every rank used to read the curated set into its own arrays (8 ranks: 8 copies, ~37 GB each for 1M rows of 4.6k
tokens). Now local rank 0 reads it and writes its flat arrays once as ``.npy`` files into a directory of the machine's
temp dir (``TMPDIR``); every local rank, rank 0 too, maps them read-only (``np.load(mmap_mode="r")``): the page cache
holds one copy for the machine, and can page it out under pressure instead of an out-of-memory kill.

This runs in ``prepare``, before any process group exists, so the ranks meet through the files: the others wait for
``complete``, or for ``failed`` (rank 0's error, raised on every rank). Where the arrays cannot be written (a small
temp dir) each rank reads the set itself, as before, with a warning. Local rank 0 removes the directory when training
ends; a killed job's is removed by the next one to start on the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toprcli.errors import UserError
from toprcli.training.batching import TokenData

PREFIX = "topr-data-"
FIELDS = tuple(f.name for f in dataclasses.fields(TokenData))
WAIT_S = 3600.0  # as long as a collective may wait: rank 0 may be reading a large set from a slow filesystem
FALLBACK = "fallback"  # the failed file's word for "read it yourself"


def local_ranks() -> tuple[int, int]:
    """(this process's local rank, the ranks on this machine) as torchrun sets them; (0, 1) alone."""
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def directory(out: Path, data_fingerprint: str) -> Path:
    """Where this launch's ranks on this machine share the set: by the output, the data's files, the launch and the
    machine (a rerun of the job maps its own, never a stale one of another launch)."""
    launch = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID")]
    launch.append(socket.gethostname())  # a TMPDIR on a shared filesystem: each machine its own, never another's half-written
    key = hashlib.sha1("\0".join([str(Path(out).resolve()), data_fingerprint, *launch]).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"{PREFIX}{key}"


def shared_on_node(load: Callable[[], TokenData], where: Path) -> TokenData:
    """``load()``'s arrays, read once per machine and mapped by every local rank; ``load()`` itself alone."""
    local_rank, local_world = local_ranks()
    if local_world <= 1:
        return load()
    if local_rank == 0 and not _write(where, load):
        return load()
    return _mapped(where, load)


def _write(where: Path, load: Callable[[], TokenData]) -> bool:
    """Local rank 0: the arrays into ``where`` (False: they could not be written, and every rank reads the set)."""
    _remove_orphans()
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        data = load()
    except BaseException as e:  # the others raise it too, instead of waiting for arrays that will not come
        _fail(where, f"error: {e}")
        raise
    try:
        tmp.mkdir(parents=True)
        (tmp / "owner").write_text(_owner())  # first: a kill while writing leaves a directory the next job removes
        for name in FIELDS:
            np.save(tmp / f"{name}.npy", getattr(data, name))
        shutil.rmtree(where, ignore_errors=True)
        os.replace(tmp, where)
        (where / "complete").touch()
        del data
        import pyarrow as pa

        pa.default_memory_pool().release_unused()  # what reading the Parquet columns took, back to the machine
        return True
    except OSError as e:  # a temp dir too small for the set: each rank holds its own copy, as before
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(f"cannot share the training set between this machine's ranks in {where.parent} ({e.strerror}): each rank "
                      "reads its own copy — point TMPDIR at a directory with room for it", stacklevel=2)
        _fail(where, FALLBACK)
        return False


def _fail(where: Path, why: str) -> None:
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        (where / "owner").write_text(_owner())
        (where / "failed").write_text(why)


def _owner() -> str:
    return f"{os.getpid()} {socket.gethostname()}"  # local rank 0: whose the directory is


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
    return TokenData(**{name: np.load(where / f"{name}.npy", mmap_mode="r") for name in FIELDS})


def remove(where: Path) -> None:
    """Local rank 0, when training ends: the mapped files go (a rank still mapping them keeps its pages until it exits)."""
    if local_ranks()[0] == 0:
        shutil.rmtree(where, ignore_errors=True)


def _remove_orphans() -> None:
    """The directories of jobs killed on this machine (their local rank 0 is gone)."""
    for entry in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            pid, _, host = (entry / "owner").read_text().partition(" ")
            if host == socket.gethostname() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(entry, ignore_errors=True)  # (another host's or container's, sharing the temp dir: not ours to judge)
