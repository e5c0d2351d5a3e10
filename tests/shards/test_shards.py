"""The shard store: atomic writes, resume, manifests and the schema validator."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from toprcli import shards
from toprcli.errors import UserError


def samples_table(n: int = 3, start: int = 0) -> pa.Table:
    rows = {
        "prompt_id": [f"p{i}" for i in range(start, start + n)],
        "prompt": ["Q: 1+1\nA:"] * n,
        "answer": ["2"] * n,
        "prompt_token_ids": [[1, 2, 3]] * n,
        "sample_index": list(range(n)),
        "completion": [" 2"] * n,
        "completion_token_ids": [[4, 5]] * n,
        "behavior_logprobs": [[-0.1, -0.2]] * n,
        "finish_reason": ["stop"] * n,
        "policy": ["m"] * n,
        "iteration": [0] * n,
    }
    return pa.Table.from_pydict(rows, schema=shards.SAMPLES_SCHEMA)


def test_write_and_read_shards_with_metadata(tmp_path):
    shards.write_shard(tmp_path, 1, samples_table(2, 2), {"temperature": 1.0})
    shards.write_shard(tmp_path, 0, samples_table(2, 0), {"temperature": 1.0})
    assert list(shards.complete_shards(tmp_path)) == [0, 1]
    t = shards.read_table(tmp_path)
    assert t.column("prompt_id").to_pylist() == ["p0", "p1", "p2", "p3"]  # shard order
    assert shards.read_file_metadata(tmp_path / "shard-00000.parquet") == {"temperature": 1.0}
    shards.validate_columns(t, "samples", tmp_path)


def test_half_written_temporary_is_ignored_and_replaced(tmp_path):
    shards.write_shard(tmp_path, 0, samples_table())
    # What a writer killed mid-way leaves behind: a truncated temporary file named with its (now dead) pid.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".shard-00001.parquet.{dead.pid}.tmp").write_bytes(b"PAR1 truncated")
    assert list(shards.complete_shards(tmp_path)) == [0]
    assert shards.read_table(tmp_path).num_rows == 3
    # Another data-parallel writer, alive, writing its shard into the same directory: its temporary stays.
    with subprocess.Popen(["sleep", "30"]) as alive:
        live = tmp_path / f".shard-00002.parquet.{alive.pid}.tmp"
        live.write_bytes(b"PAR1 being written")
        # And another machine's (--num-shards over hosts): its pid means nothing here, so it stays too.
        remote = tmp_path / f".shard-00003.parquet.{dead.pid}-0123abcd.tmp"
        remote.write_bytes(b"PAR1 being written elsewhere")
        assert shards.remove_stale_temporaries(tmp_path) == 1 and live.exists() and remote.exists()
        alive.kill()
        time.sleep(0.2)  # killed, not yet reaped: a zombie was taken for a live writer and its temporary kept for good
        assert shards.remove_stale_temporaries(tmp_path) == 1 and not live.exists()
    remote.unlink()
    shards.write_shard(tmp_path, 1, samples_table())
    assert list(shards.complete_shards(tmp_path)) == [0, 1]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError):
        shards.write_shard(tmp_path, 0, samples_table())
    assert os.listdir(tmp_path) == []


def test_manifest_roundtrip(tmp_path):
    shards.write_manifest(tmp_path, stage="generate", config={"n": 2}, counts={"rows": 3}, wall_time_s=1.5)
    m = shards.read_manifest(tmp_path)
    assert m["stage"] == "generate" and m["config"] == {"n": 2} and m["counts"]["rows"] == 3
    assert "torch" in m["versions"] and "pyarrow" in m["versions"]
    assert shards.read_manifest(tmp_path / "nothing") is None


def test_validator_names_missing_column_and_file(tmp_path):
    t = samples_table().drop(["behavior_logprobs"])
    with pytest.raises(UserError) as e:
        shards.validate_columns(t, "samples", "x/shard-00000.parquet")
    msg = str(e.value)
    assert "x/shard-00000.parquet" in msg and "'behavior_logprobs'" in msg and "topr generate" in msg


def test_validator_names_mistyped_column():
    t = samples_table()
    t = t.set_column(t.schema.get_field_index("sample_index"), "sample_index", pa.array(["0", "1", "2"]))
    with pytest.raises(UserError, match=r"'sample_index' has type string, expected int32"):
        shards.validate_columns(t, "samples", "f.parquet")
    with pytest.raises(UserError, match="missing column 'reward'"):
        shards.validate_columns(samples_table(), "scored", "f.parquet")


def test_validator_accepts_large_types_and_extra_columns():
    t = samples_table()
    t = t.set_column(0, "prompt_id", t.column("prompt_id").cast(pa.large_string()))
    t = t.append_column("extra", pa.array([1, 2, 3]))
    shards.validate_columns(t, "samples", "f.parquet")
    c = shards.conform(t, "samples")
    assert c.schema.field("prompt_id").type == pa.string() and c.column_names[-1] == "extra"


def test_read_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        shards.read_table(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no shard"):
        shards.read_table(tmp_path / "empty")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(UserError, match="not a readable Parquet"):
        shards.read_table(bad)


def test_fingerprint_changes_with_content(tmp_path):
    shards.write_shard(tmp_path, 0, samples_table())
    a = shards.fingerprint(tmp_path)
    shards.write_shard(tmp_path, 1, samples_table())
    assert shards.fingerprint(tmp_path) != a
    # bookkeeping a rerun rewrites (the manifest, process logs) is not data: same fingerprint
    b = shards.fingerprint(tmp_path)
    (tmp_path / "_manifest.json").write_text("{}")
    (tmp_path / "_logs").mkdir()
    (tmp_path / "_logs" / "part-0.log").write_text("log")
    assert shards.fingerprint(tmp_path) == b


def test_files_that_each_pass_the_check_read_together_and_mismatched_ones_are_one_error(tmp_path):
    """list<int32> beside large_list<int32> (both pass the column contract) once raised ArrowTypeError."""
    import pyarrow.parquet as pq

    from toprcli.errors import UserError
    from toprcli.shards import read_table

    pq.write_table(pa.table({"ids": pa.array([[1, 2]], pa.list_(pa.int32())), "s": pa.array(["a"])}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"ids": pa.array([[3]], pa.large_list(pa.int32())), "s": pa.array(["b"], pa.large_string())}), tmp_path / "b.parquet")
    both = read_table([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert both.column("ids").to_pylist() == [[1, 2], [3]] and both.column("s").to_pylist() == ["a", "b"]
    pq.write_table(pa.table({"ids": pa.array(["x"]), "s": pa.array(["c"])}), tmp_path / "c.parquet")
    with pytest.raises(UserError, match="columns do not match"):
        read_table([tmp_path / "a.parquet", tmp_path / "c.parquet"])


def test_a_directory_swapped_into_place_has_the_umasks_permissions(tmp_path):
    """mkdtemp makes 0700 and safetensors writes 0600: a model built for a shared cache was readable by its builder only."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp / "sub").mkdir(mode=0o700)
    (tmp / "sub" / "weights").write_bytes(b"x")
    os.chmod(tmp / "sub" / "weights", 0o600)
    old = os.umask(0o022)
    try:
        out = shards.swap_dir_into_place(tmp, tmp_path / "model")
    finally:
        os.umask(old)
    modes = [oct(p.stat().st_mode & 0o777) for p in (out, out / "sub", out / "sub" / "weights")]
    assert modes == ["0o755", "0o755", "0o644"]


def test_a_killed_builds_directory_is_removed_by_the_next_build_and_a_live_ones_kept(tmp_path):
    """A SIGKILLed `topr init-model` or `import-gguf` left a hidden directory the size of a model beside its output, forever."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    with subprocess.Popen(["sleep", "30"]) as alive:
        host = shards.build_dir_beside(tmp_path / "model").name.rsplit("-", 1)[-1]  # this machine's tag, ".tmp" included
        leftovers = {pid: tmp_path / f".model.abcd.{pid}-{host}" for pid in (dead.pid, alive.pid)}
        for d in leftovers.values():
            d.mkdir()
            (d / "model.safetensors").write_bytes(b"half")
        new = shards.build_dir_beside(tmp_path / "model")
        assert new.is_dir() and not leftovers[dead.pid].exists() and leftovers[alive.pid].exists()
        assert not (tmp_path / "model").exists()  # only the build directory is made
        alive.kill()


def test_a_models_files_name_it_after_its_path_is_gone(tmp_path):
    """A curated file records each source's policy by path and by files; `same_model` accepts a gone path by its files."""
    from toprcli.shards import model_identity, models_of, same_model

    model = tmp_path / "new" / "policy"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    files = model_identity(str(model))
    curated = {"generation": {"round-1/scored": {"generation": {"model": "/old/policy", "model_files": files}}, "round-0/scored": {}}}
    assert models_of(curated) == {"/old/policy": files}
    assert models_of({"generation": {"model": "/old/policy", "model_files": files, "n": 4}}) == {"/old/policy": files}  # a shard's own
    assert models_of({"generation": {"model": "/old/policy"}}) == {}  # written before model_files
    assert same_model("/old/policy", str(model), files) and not same_model("/old/policy", str(model))
    (model / "config.json").write_text('{"changed": 1}')  # other files at that path: another model
    assert not same_model("/old/policy", str(model), files)


def test_every_mistyped_column_is_named_at_once(tmp_path):
    """A scored file written from a pandas DataFrame (int64 ids, float64 log-probs) was refused one column per rerun."""
    import pyarrow as pa

    from toprcli.shards.schema import SCORED_SCHEMA, validate_columns

    fields = [pa.field(f.name, pa.list_(pa.int64()) if f.name.endswith("token_ids") else pa.int64() if f.name == "sample_index" else f.type)
              for f in SCORED_SCHEMA]
    with pytest.raises(UserError) as e:
        validate_columns(pa.schema(fields), "scored", tmp_path / "x.parquet")
    said = str(e.value)
    assert "'prompt_token_ids' has type list<int64>" in said and "'completion_token_ids'" in said and "'sample_index' has type int64" in said


def test_a_write_error_names_the_path_asked_for_not_its_temporary(tmp_path):
    import errno

    from toprcli.shards.files import output_error, temporary_name

    e = PermissionError(errno.EACCES, "Permission denied", str(temporary_name(tmp_path / "ro" / "x.yaml")))
    assert str(output_error(e)) == f"cannot write {tmp_path / 'ro' / 'x.yaml'}: permission denied — choose a writable output path (or fix its permissions)"


def test_an_output_that_is_a_symlink_is_built_locked_and_replaced_where_it_points(tmp_path):
    """`train -o link` built the policy beside the link (on the link's disk) and swapped it over the link: a real dir
    at the link, an empty target and the old version, moved aside as a link, never deleted. The lock was taken on the
    path as typed, so a writer through the link ran beside one writing the target."""
    target, link = tmp_path / "disk2" / "policy", tmp_path / "run" / "policy"
    target.mkdir(parents=True)
    (target / "old.txt").write_text("old")
    link.parent.mkdir()
    link.symlink_to(target)
    tmp = shards.build_dir_beside(link)
    assert tmp.parent == target.parent
    (tmp / "new.txt").write_text("new")
    shards.swap_dir_into_place(tmp, link)
    assert link.is_symlink() and sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["policy"] and sorted(p.name for p in link.parent.iterdir()) == ["policy"]
    with shards.output_lock(target):
        with pytest.raises(UserError, match="is being written by"):
            with shards.output_lock(link):
                pass


def test_lock_holder_names_a_live_writer_and_not_a_killed_ones_file(tmp_path):
    """`topr report` on a run with an unfinished round could not tell a running run from a stopped one: who holds the
    lock is read from the kernel's lock table, never by taking the lock (a starting writer would then be refused)."""
    import sys

    out = tmp_path / "run"
    assert shards.lock_holder(out) is None
    code = f"import time\nfrom toprcli.shards import output_lock\nwith output_lock({str(out)!r}):\n    print('locked', flush=True)\n    time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        holder = shards.lock_holder(out)
        assert holder is not None and holder.startswith(f"pid {child.pid} on ") and time.strftime("%Y-%m-%d") in holder
        with shards.output_lock(tmp_path / "other"):  # reading it took nothing: another writer of another output is unaffected,
            pass
        with pytest.raises(UserError, match="is being written by"):  # and this output's lock is still the child's
            with shards.output_lock(out):
                pass
    finally:
        child.kill()
        child.wait()
    assert (tmp_path / ".run.lock").exists() and shards.lock_holder(out) is None  # the killed writer's file: no holder
    (tmp_path / ".run.lock").write_text("pid 4242 on gpu-node-17 since 2026-11-27 09:00:00 (topr iterate)")  # a Slurm node's run
    assert shards.lock_holder(out) == ("pid 4242 on gpu-node-17 since 2026-11-27 09:00:00 (topr iterate) — another machine: whether it "
                                       "still runs cannot be checked from here")


def test_a_filesystem_without_file_locks_is_warned_of_and_the_work_goes_on(tmp_path, monkeypatch):
    """flock on some NFS and Lustre mounts fails with ENOLCK or ENOSYS: every command was a traceback there."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(UserWarning, match=r"does not support file locks \(No locks available\): nothing stops a second command writing out"):
        with shards.output_lock(tmp_path / "out"):
            (tmp_path / "out").write_text("done")
    assert (tmp_path / "out").read_text() == "done" and not (tmp_path / ".out.lock").exists()
    with pytest.warns(UserWarning), pytest.raises(RuntimeError) as failed:  # the work's own error, not told as one during the lock's
        with shards.output_lock(tmp_path / "out"):
            raise RuntimeError("a bug in the work")
    assert failed.value.__context__ is None


def test_the_old_version_a_killed_swap_left_is_removed_by_the_next_build(tmp_path, monkeypatch):
    """`--overwrite` moves the old output aside, renames the new one in, then deletes the old: a kill in between left the
    old version (a whole model) under a hidden name that nothing removed."""
    out = tmp_path / "policy"
    out.mkdir()
    (out / "old.bin").write_bytes(b"x" * 100)
    new = shards.build_dir_beside(out)
    (new / "new.bin").write_bytes(b"y")
    monkeypatch.setattr(shards.files.shutil, "rmtree", lambda *a, **k: None)  # killed before the old one is deleted
    shards.swap_dir_into_place(new, out)
    monkeypatch.undo()
    [left] = [p for p in tmp_path.iterdir() if p.name.startswith(".policy.old")]
    dead = left.with_name(left.name.replace(f".{os.getpid()}-", ".999999-"))  # its process, gone
    left.rename(dead)
    shards.build_dir_beside(out)  # the next writer of the output
    assert not dead.exists() and (out / "new.bin").is_file()
    dead.mkdir()  # again, and the next writer builds elsewhere (train: <out>.partial) and swaps it in
    partial = tmp_path / "policy.partial"
    partial.mkdir()
    shards.swap_dir_into_place(partial, out)
    assert not dead.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".policy.old")]
