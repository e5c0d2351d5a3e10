"""Files written whole or not at all, and outputs that one process at a time may write.

Every write in toprcli goes through here: a temporary name in the same
directory, fsync, rename (:func:`write_text_atomic`, :func:`write_json_atomic`;
Parquet tables in :mod:`toprcli.shards.store`), and whole directories built
aside then swapped in (:func:`swap_dir_into_place`). Before a stage works it
checks its output can be written (:func:`check_writable`) and takes the
output's advisory lock (:func:`output_lock`); permission and disk errors become
one line (:func:`output_error`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toprcli.errors import OutputLocked, UserError


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# This machine in a temporary's name: hosts sharing an output directory (--num-shards over machines)
# must not judge each other's writers by their own process table.
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``.<name>.<pid>-<host>.tmp`` beside it, so that
    :func:`remove_stale_temporaries` can tell a killed writer's from a live one's, on any machine."""
    return path.with_name(f".{path.name}.{os.getpid()}-{_HOST}.tmp")


def write_atomic(path: str | os.PathLike[str], write: Any) -> Path:
    """``write(tmp)`` fills a temporary file next to ``path``; fsync, rename: ``path`` is whole or absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with disk_full_named(path):
            write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)
    return path


def through_link(path: str | os.PathLike[str]) -> Path:
    """``path``, or where a symlink at ``path`` points: an output built beside the link would land on the link's disk,
    and the swap would replace the link (the old version, moved aside as a link, was never deleted), not its target."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def swap_dir_into_place(tmp: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Rename a completely written directory ``tmp`` to ``out``; an existing ``out`` is moved
    aside first and deleted after, so ``out`` is never missing a whole version or half-written."""
    tmp, out = Path(tmp), through_link(out)
    _settle(tmp)
    for left in out.parent.glob(f".{out.name}.old.*.tmp"):  # an old version a killed swap left (train builds in <out>.partial)
        if not _writer_alive(left.name):
            shutil.rmtree(left, ignore_errors=True)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old.{os.getpid()}-{_HOST}.tmp"  # a kill before it is gone: build_dir_beside removes it
        os.replace(out, old)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask can only be read by setting it)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _settle(tmp: Path) -> None:
    """Before ``tmp`` is renamed into place: its files on disk (a host crash must not leave a
    complete-looking directory with an empty weights file), and the permissions the umask gives new
    files (``mkdtemp`` makes 0700 and safetensors writes 0600: a shared cache, or an engine running
    as another user, could not read the model)."""
    mask = _umask()
    for root, dirs, files in os.walk(tmp):
        for name in files:
            path = os.path.join(root, name)
            os.chmod(path, 0o666 & ~mask)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(root, 0o777 & ~mask)
        fsync_dir(Path(root))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that the file either exists whole or not at all."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None: JSON has no such numbers (a parser such as JavaScript's refuses them)."""
    if isinstance(obj, (dict, list, tuple)):
        return {k: json_safe(v) for k, v in obj.items()} if isinstance(obj, dict) else [json_safe(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def check_not_an_input(out: str | os.PathLike[str], inputs: list[str], example: str) -> None:
    """Refuse an output file that is one of the scored ``inputs`` (``--overwrite`` would replace it) or lies inside an
    input directory (its files would count as the input's); ``example``: a file name to suggest beside the input."""
    target = Path(out).resolve()
    for s in inputs:
        if Path(s).is_dir() and target.is_relative_to(Path(s).resolve()):
            raise UserError(f"--out {out} is inside the scored input {s} — write it beside, e.g. {Path(s).parent / example}")
        if target == Path(s).resolve():
            raise UserError(f"--out {out} is the scored input {s} — write it to another file, e.g. {Path(s).with_name(example)}")


def read_jsonl_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``metrics.jsonl``), in order; a line a kill cut short (or a blank one) is
    skipped, as training's resume drops it."""
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield record


def read_json(path: str | os.PathLike[str], *, needs: str | None = None) -> Any:
    """A JSON file toprcli wrote (written whole, so a bad one was edited or is not ours): its data, or one error line
    naming the file. ``needs``: a key the document must have (a mapping)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except IsADirectoryError:
        raise UserError(f"{p} is a directory, where topr keeps a JSON file — move it away") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{p} is not valid JSON ({getattr(e, 'msg', e)}) — it was edited or is not topr's: restore or delete it") from None
    if needs is not None and (not isinstance(data, dict) or needs not in data):
        raise UserError(f"{p} has no {needs!r} — it was edited or is not topr's: restore or delete it")
    return data


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# -- output paths: writability and one writer at a time ------------------------------

# errno values that mean "this output cannot be written here" (a user's problem, not a bug).
_UNWRITABLE = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted", errno.EROFS: "read-only file system"}
_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_NOT_A_DIR = {errno.ENOTDIR, errno.EEXIST}  # a path below a file: mkdir(parents=True) says EEXIST, open says ENOTDIR


@contextlib.contextmanager
def disk_full_named(path: str | os.PathLike[str]) -> Iterator[None]:
    """Writes by libraries that report a full disk in their own exception types (safetensors' SafetensorError,
    torch.save's RuntimeError "unexpected pos", a checkpoint's CheckpointException): re-raised as the OSError (ENOSPC)
    they are, naming ``path``, when the message says so or the disk holding ``path`` is full now (before the
    caller's cleanup frees what the write took). Anything else goes on as it was."""
    try:
        yield
    except OSError:
        raise
    except BaseException as e:  # torch's CheckpointException is a BaseException
        if not isinstance(e, Exception) and type(e).__name__ != "CheckpointException":
            raise  # a signal's Interrupted, KeyboardInterrupt, SystemExit
        text, where = str(e), Path(path).absolute()
        while not where.exists() and where != where.parent:
            where = where.parent
        if "os error 28" in text or "no space left" in text.lower() or shutil.disk_usage(where).free < _FULL_BELOW:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise


_FULL_BELOW = 16 << 20  # bytes free under which a failed write is the disk's fault


def output_error(e: OSError, path: str | os.PathLike[str] | None = None) -> UserError | None:
    """A UserError (one line: path, problem, fix) for a permission or disk error; None for other OSErrors."""
    text = str(e)
    if e.errno == errno.ENAMETOOLONG:
        return UserError(f"cannot write {path or e.filename}: a file name in that path is too long for its file system — choose a shorter output name")
    code = e.errno if e.errno in _UNWRITABLE or e.errno in _FULL or e.errno in _NOT_A_DIR else None
    if code is None:  # pyarrow reports some of these without errno
        code = next((c for c, words in {**_UNWRITABLE, **_FULL}.items() if words in text.lower()), None)
    if code is None:
        return None
    where = e.filename or path or "the output"
    if e.filename and (real := re.fullmatch(r"\.(.+?)\.\d+-.*\.tmp", Path(str(e.filename)).name)):  # a temporary_name: the path asked for
        where = Path(str(e.filename)).with_name(real.group(1))
    if code in _NOT_A_DIR:
        return UserError(f"cannot write {where}: a part of that path is a file, not a directory — choose another output path")
    if code in _FULL:
        return UserError(f"cannot write {where}: {_FULL[code]} — free disk space or choose an output on another disk")
    return UserError(f"cannot write {where}: {_UNWRITABLE[code]} — choose a writable output path (or fix its permissions)")


def check_output_dir(out: Path) -> None:
    """A stage's output directory: not a file, and not a model's directory (shards and a manifest were written among its
    weights)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} is a file — pass a directory to --out")
    if (out / "config.json").is_file():
        raise UserError(f"--out {out} is a model's directory (it has a config.json) — write the output to a directory of its own")


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail before any work when ``path`` (a file or directory to be written) cannot be created there.

    Probes with a temporary file in ``path`` if it is an existing directory, else in the nearest
    existing parent, and removes it: nothing is left behind.
    """
    p = Path(path).absolute()
    probe_dir = p if p.is_dir() else p.parent
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".topr-write-probe-", dir=probe_dir)
    except OSError as e:
        err = output_error(e, probe_dir)
        if err is None:
            raise
        raise UserError(f"cannot write {p}: {str(err).split(': ', 1)[1]}") from None
    os.close(fd)
    os.unlink(name)
    with contextlib.suppress(OSError, ValueError):  # the longest name written beside it: its manifest's temporary (curate)
        if len(temporary_name(p.with_name(p.name + ".manifest.json")).name.encode()) > os.pathconf(probe_dir, "PC_NAME_MAX"):
            raise UserError(f"cannot write {p}: its name ({len(p.name)} characters) leaves no room for the temporary files written "
                            "beside it under the file system's limit — choose a shorter output name")


def _lock_path(path: Path, part: str) -> Path:
    return path.parent / f".{path.name}.lock{part}"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str], part: str = "") -> Iterator[None]:
    """One writer at a time for ``path``: an exclusive advisory lock (``fcntl``) for the whole run.

    A second writer fails at once with one line naming the process that holds the
    lock. The lock file sits next to the output (``.<name>.lock<part>``) while the
    run lasts and is removed at its end; the kernel drops the lock when its process
    dies, so a killed run never blocks the rerun. ``part`` separates writers that
    share an output on purpose (the shard ranges of data-parallel generation).
    """
    import fcntl  # POSIX only; toprcli runs on Linux

    lock = _lock_path(Path(path).resolve(), part)  # a symlink and its target are one output
    lock.parent.mkdir(parents=True, exist_ok=True)
    unsupported = None
    while True:
        fh = open(lock, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise OutputLocked(f"{path} is being written by {holder} — wait for it to finish, or write to another output") from None
        except OSError as e:  # a filesystem without flock (some NFS and Lustre mounts): the work goes on, unguarded
            if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            fh.close()
            unsupported = e.strerror
            break
        try:  # the holder before us may have removed the file between our open and our lock: lock the new one
            if os.fstat(fh.fileno()).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        fh.close()
    if unsupported is not None:  # outside the except: the body's own errors are not told as "during handling of" this one
        lock.unlink(missing_ok=True)
        import warnings

        warnings.warn(f"{lock.parent} does not support file locks ({unsupported}): nothing stops a second command writing "
                      f"{Path(path).name} at the same time — run one at a time")  # (from here: topr's one line)
        yield
        return
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} ({' '.join(sys.argv[:3])[:120]})")
        fh.flush()
        yield
    finally:
        lock.unlink(missing_ok=True)  # still ours: we hold the lock on this inode
        fh.close()


def lock_holder(path: str | os.PathLike[str]) -> str | None:
    """Who holds ``path``'s output lock now (its line: pid, host, since when, command), read without taking it (a
    reader must never make a starting writer fail), else None. The kernel's table of this machine's locks says
    whether the lock file's inode is locked; a killed writer's file is no holder."""
    lock = _lock_path(Path(path).resolve(), "")
    try:
        st, holder = lock.stat(), lock.read_text().strip()
        pid, _, rest = holder.removeprefix("pid ").partition(" on ")
        if rest and rest.split(" ", 1)[0] != socket.gethostname():  # another machine's table: only it can tell
            return f"{holder} — another machine: whether it still runs cannot be checked from here"
        with open("/proc/locks", encoding="ascii") as f:  # "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"
            held = any(fields[4:5] == [pid] and fields[5].endswith(f":{st.st_ino}") for fields in map(str.split, f) if len(fields) > 5)
        return holder if held else None
    except OSError:  # no lock file (nothing running), or no /proc
        return None


def remove_stale_lock(path: str | os.PathLike[str], part: str = "") -> None:
    """Remove the lock file a killed writer of ``path`` left (the kernel dropped its lock); a held one stays."""
    if not _lock_path(Path(path).resolve(), part).exists():  # the usual case: nothing to take (a check, not a write)
        return
    with contextlib.suppress(UserError, OSError):
        with output_lock(path, part):
            pass


def build_dir_beside(out: str | os.PathLike[str]) -> Path:
    """A new empty directory next to ``out`` to build it in, then :func:`swap_dir_into_place`. Named after
    this process and machine (``.<name>.<random>.<pid>-<host>.tmp``), so the directories killed builders
    of ``out`` left behind (a whole model each) can be told from live ones, and are removed first."""
    out = through_link(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for entry in out.parent.glob(f".{out.name}.*.tmp"):
        if entry.is_dir() and not _writer_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=f".{os.getpid()}-{_HOST}.tmp", dir=out.parent))


def remove_stale_temporaries(directory: str | os.PathLike[str], of: str | None = None) -> int:
    """Delete ``.tmp`` files a killed writer of this machine left behind (only ``of``'s, when given: a file's
    name in ``directory``); returns how many. A temporary of a live process (:func:`temporary_name`) or of
    another machine is kept: data-parallel writers share a directory."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    n = 0
    for entry in directory.iterdir():
        if entry.name.endswith(".tmp") and (of is None or entry.name.startswith(f".{of}.")) and not _writer_alive(entry.name):
            entry.unlink(missing_ok=True)
            n += 1
    return n


def _writer_alive(name: str) -> bool:
    """Whether the process named in a ``write_atomic`` temporary (``.<name>.<pid>.tmp``) is running (not this one:
    whatever this process left is stale by the time it cleans up)."""
    pid, _, host = name.removesuffix(".tmp").rsplit(".", 1)[-1].partition("-")
    if host and host != _HOST:
        return True  # another machine's writer: only its own machine can tell
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    with contextlib.suppress(OSError, IndexError):  # a killed writer its parent has not reaped yet: dead, its file stale
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
