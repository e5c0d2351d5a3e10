"""One copy of the training set per machine: local rank 0 writes the arrays, every local rank maps them; what a rank that
waits sees when rank 0 failed, and the fallback where the arrays cannot be written. (Two real ranks under torchrun:
tests/training/test_distributed.py.)"""

from __future__ import annotations

import errno
import socket

import numpy as np
import pytest

from toprcli.errors import UserError
from toprcli.training import node_data
from toprcli.training.batching import TokenData


def _data() -> TokenData:
    off = np.array([0, 2, 5], dtype=np.int64)
    return TokenData(np.array([1, 2, 3, 4, 5], dtype=np.int32), off, np.array([6, 7, 8, 9, 10], dtype=np.int32), off,
                     -np.ones(5, dtype=np.float32), off, np.array([1.0, -1.0], dtype=np.float32), np.ones(2, dtype=np.float32))


def _as(monkeypatch, rank: int) -> None:
    """This process as local rank ``rank`` of two (node_data reads torchrun's variables)."""
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def test_local_rank_0_writes_once_and_every_rank_maps_the_same_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(node_data.tempfile, "tempdir", str(tmp_path))  # the machine's temp dir (TMPDIR, read once)
    where = tmp_path / "topr-data-x"
    loads = []

    def load() -> TokenData:
        loads.append(1)
        return _data()

    for rank in (0, 1):
        _as(monkeypatch, rank)
        got = node_data.shared_on_node(load, where)
        assert all(np.array_equal(getattr(got, f), getattr(_data(), f)) for f in node_data.FIELDS)
        assert isinstance(got.completion_ids, np.memmap) and not got.completion_ids.flags.writeable  # mapped, read-only
    assert len(loads) == 1  # rank 1 never read the set
    node_data.remove(where)  # rank 1: not its to remove
    assert where.is_dir()
    _as(monkeypatch, 0)
    node_data.remove(where)
    assert not where.exists()


def test_a_rank_waiting_on_a_failed_rank_0_raises_its_error(tmp_path, monkeypatch):
    """Rank 0's bad data (a null in a token list) was raised by rank 0 alone: the others would wait for arrays that never came."""
    monkeypatch.setattr(node_data.tempfile, "tempdir", str(tmp_path))
    where = tmp_path / "topr-data-x"

    def bad() -> TokenData:
        raise UserError("train.parquet: column 'completion_token_ids' has a null in row 3")

    _as(monkeypatch, 0)
    with pytest.raises(UserError, match="has a null in row 3"):
        node_data.shared_on_node(bad, where)
    _as(monkeypatch, 1)
    with pytest.raises(UserError, match="local rank 0 could not read the training set — train.parquet: column 'completion_token_ids' has a null"):
        node_data.shared_on_node(bad, where)


def test_a_temp_dir_too_small_is_not_filled_and_rank_0_keeps_what_it_read(tmp_path, monkeypatch):
    """Writing until ENOSPC filled the machine's temp dir for everyone, and rank 0 then read the set a second time."""
    import shutil

    monkeypatch.setattr(node_data.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(node_data.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    loads = []
    _as(monkeypatch, 0)
    with pytest.warns(UserWarning, match=r"cannot share the training set .*GiB needed"):
        got = node_data.shared_on_node(lambda: loads.append(1) or _data(), tmp_path / "topr-data-x")
    assert len(loads) == 1 and not isinstance(got.completion_ids, np.memmap)
    assert sorted(p.name for p in (tmp_path / "topr-data-x").iterdir()) == ["failed", "owner"]  # no array written


def test_a_temp_dir_without_room_falls_back_to_a_copy_per_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(node_data.tempfile, "tempdir", str(tmp_path))
    where = tmp_path / "topr-data-x"

    def no_room(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(node_data.np, "save", no_room)
    _as(monkeypatch, 0)
    with pytest.warns(UserWarning, match=r"cannot share the training set .* \(No space left on device\): each rank reads its own copy"):
        got = node_data.shared_on_node(_data, where)
    assert not isinstance(got.completion_ids, np.memmap) and not list(tmp_path.glob("*.tmp"))
    _as(monkeypatch, 1)
    assert np.array_equal(node_data.shared_on_node(_data, where).completion_ids, _data().completion_ids)  # read itself


def test_a_killed_jobs_arrays_are_removed_by_the_next_on_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(node_data.tempfile, "tempdir", str(tmp_path))  # the machine's temp dir (TMPDIR, read once)
    dead = tmp_path / "topr-data-dead"
    dead.mkdir()
    (dead / "owner").write_text(f"999999 {socket.gethostname()} {node_data._pid_namespace()}")  # its local rank 0, gone
    (tmp_path / "topr-data-other").mkdir()  # a container sharing /tmp, same host name: its pids are not ours to see
    (tmp_path / "topr-data-other" / "owner").write_text(f"999999 {socket.gethostname()} pid:[4026531999]")
    (dead / "completion_ids.npy").write_bytes(b"x" * 100)
    _as(monkeypatch, 0)
    node_data.shared_on_node(_data, tmp_path / "topr-data-new")
    assert not dead.exists() and (tmp_path / "topr-data-new" / "complete").is_file() and (tmp_path / "topr-data-other").is_dir()
