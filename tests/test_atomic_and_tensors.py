import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from kinfolk import atomic
from kinfolk.atomic import (
    OutputExistsError,
    atomic_directory,
    atomic_file,
    check_destination,
    clean_dead_staging,
    current_writer,
    directory_fingerprint,
    exchange,
    fingerprint,
    staging_owner,
    write_json,
)
from kinfolk.errors import CorruptFileError, MissingInputError, cli_spelling
from kinfolk.tensors import INDEX_FILE, ShardedWriter, TensorReader


def test_failed_block_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "out") as staging:
        (staging / "half.txt").write_text("partial")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_existing_destination_is_refused_then_replaced(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match=r"pass overwrite=True to"), atomic_directory(tmp_path / "out"):
        pass  # a Python caller is told the keyword; the command line (`cli_spelling`) its flag
    with cli_spelling(), pytest.raises(OutputExistsError, match="exists; pass --overwrite to replace it"):
        check_destination(tmp_path / "out", overwrite=False)
    with atomic_directory(tmp_path / "out", overwrite=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary siblings left


def test_atomic_file_keeps_old_content_on_failure(tmp_path):
    target = tmp_path / "report.json"
    write_json(target, {"v": 1})
    with pytest.raises(ValueError), atomic_file(target) as handle:
        handle.write("{broken")
        raise ValueError
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_fingerprints_are_stable_and_sensitive(tmp_path):
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})
    (tmp_path / "config.json").write_text("{}")
    before = directory_fingerprint(tmp_path)
    (tmp_path / "config.json").write_text('{"x": 1}')
    assert directory_fingerprint(tmp_path) != before


def test_sharded_writer_round_trip_and_index(tmp_path):
    tensors = {f"layer.{i}.weight": torch.randn(16, 16) for i in range(5)}
    with ShardedWriter(tmp_path, max_shard_bytes=2 * 16 * 16 * 4, metadata={"kinfolk": "test"}) as writer:
        for name, tensor in tensors.items():
            writer.add(name, tensor)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert index["metadata"]["total_size"] == 5 * 16 * 16 * 4
    reader = TensorReader(tmp_path)
    assert reader.names() == sorted(tensors)
    assert all(torch.equal(reader.get(name), tensor) for name, tensor in tensors.items())
    assert reader.metadata()["kinfolk"] == "test"
    assert reader.shape_and_dtype("layer.0.weight") == ((16, 16), "F32")
    assert dict(reader).keys() == tensors.keys()


def test_single_shard_is_one_file_and_duplicates_refused(tmp_path):
    writer = ShardedWriter(tmp_path)
    writer.add("a", torch.ones(3))
    with pytest.raises(ValueError, match="twice"):
        writer.add("a", torch.ones(3))
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_reader_single_file_and_missing(tmp_path):
    save_file({"x": torch.arange(4.0)}, tmp_path / "delta.safetensors")
    assert TensorReader(tmp_path / "delta.safetensors").get("x").tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="'y'"):
        TensorReader(tmp_path / "delta.safetensors").get("y")
    with pytest.raises(FileNotFoundError):
        TensorReader(tmp_path / "nothing")


def test_make_room_writes_the_pending_shard_before_a_tensor_that_would_not_fit(tmp_path):
    writer = ShardedWriter(tmp_path, max_shard_bytes=64)
    writer.add("a", torch.zeros(8))  # 32 bytes pending
    writer.make_room(32)  # fits exactly: nothing written yet
    assert list(tmp_path.glob("*.safetensors")) == []
    writer.make_room(36)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    writer.add("b", torch.ones(9))
    writer.close()
    assert TensorReader(tmp_path).names() == ["a", "b"]


def test_manifest_reads_shapes_and_dtypes_from_headers(tmp_path):
    with ShardedWriter(tmp_path, max_shard_bytes=16) as writer:
        writer.add("b", torch.zeros(2, 3, dtype=torch.bfloat16))
        writer.add("a", torch.zeros(5))
    assert TensorReader(tmp_path).manifest() == {"a": ((5,), "F32"), "b": ((2, 3), "BF16")}


# ---------------------------------------------------------------------------------------------------------------
# Staging that names its writer: a later run removes a dead writer's, never a live one's.


def finished_process_id() -> int:
    """The id of a process that has exited (so, almost surely, of no running process)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def staging_name(destination, role="tmp", **writer):
    """The name of a staging sibling of `destination` as if written by `writer` (this process by default)."""
    fields = {**vars(current_writer()), **writer}
    tag = f"{fields['host']}-{fields['boot']}-{fields['pid']}-{fields['start']}-0123abcd"
    return destination.with_name(f".{destination.name}.{role}-{tag}")


def staging_of(destination, role="tmp", **writer):
    """A staging directory of `destination` left by `writer`, holding 1000 bytes."""
    path = staging_name(destination, role, **writer)
    path.mkdir()
    (path / "weights.bin").write_bytes(b"x" * 1000)
    return path


def test_staging_name_records_a_writer_this_process_recognises_as_alive(tmp_path):
    seen = []
    with atomic_directory(tmp_path / "out") as staging:
        name, role, writer = staging_owner(staging)
        seen.append(staging)
        assert (name, role, writer) == ("out", "tmp", current_writer())
        assert writer.is_alive() is True and writer.start > 0
        assert clean_dead_staging(tmp_path, "out") == []  # our own staging survives a cleaner running meanwhile
        assert staging.exists()
    assert not seen[0].exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    ("writer", "dead"),
    [
        ({"pid": "finished"}, True),  # the process is gone
        ({"start": 1}, True),  # this pid, but started at another time: the id was reused
        ({"boot": "deadbeef"}, True),  # written before the host rebooted
        ({"host": "0badf00d"}, False),  # another host (shared file system): cannot tell, so left alone
        ({}, False),  # this very process: alive
    ],
)
def test_next_run_removes_only_dead_writers_staging(tmp_path, writer, dead):
    if writer.get("pid") == "finished":
        writer["pid"] = finished_process_id()
    leftover = staging_of(tmp_path / "out", **writer)
    other = staging_of(tmp_path / "other", pid=finished_process_id())  # another destination's: not this run's
    with atomic_directory(tmp_path / "out") as staging:
        (staging / "new.txt").write_text("new")
    assert leftover.exists() is not dead
    assert other.exists()
    assert (tmp_path / "out" / "new.txt").read_text() == "new"


def test_check_destination_cleans_before_the_long_work(tmp_path):
    leftover = staging_of(tmp_path / "out", pid=finished_process_id())
    check_destination(tmp_path / "out", overwrite=False)
    assert not leftover.exists() and list(tmp_path.iterdir()) == []


def test_atomic_file_removes_dead_staging_of_its_file(tmp_path):
    leftover = staging_name(tmp_path / "report.json", pid=finished_process_id())
    leftover.write_text("{half")
    write_json(tmp_path / "report.json", {"v": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_old_output_moved_aside_by_an_interrupted_fallback_overwrite_is_restored(tmp_path):
    old = staging_of(tmp_path / "out", role="old", pid=finished_process_id())
    new = staging_of(tmp_path / "out", pid=finished_process_id())  # the complete new output, never renamed
    with pytest.raises(OutputExistsError):
        check_destination(tmp_path / "out", overwrite=False)  # the old output is back, so it is refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / "weights.bin").read_bytes() == b"x" * 1000
    assert not old.exists() and not new.exists()


def test_exchange_swaps_two_directories_atomically(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "from-a").touch()
    (tmp_path / "b").mkdir()
    if not exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this platform or file system has no atomic exchange (the fallback is tested below)")
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["from-a"]
    assert list((tmp_path / "a").iterdir()) == []


@pytest.mark.parametrize("has_exchange", [True, False])
def test_overwrite_replaces_and_leaves_nothing_beside(tmp_path, monkeypatch, has_exchange):
    if not has_exchange:
        monkeypatch.setattr(atomic, "exchange", lambda first, second: False)
    with atomic_directory(tmp_path / "out") as staging:
        (staging / "v").write_text("1")
    with atomic_directory(tmp_path / "out", overwrite=True) as staging:
        (staging / "v").write_text("2")
    assert (tmp_path / "out" / "v").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("has_exchange", [True, False])
def test_overwrite_keeps_a_whole_output_after_every_file_system_step(tmp_path, monkeypatch, has_exchange):
    """After each rename or exchange of an overwrite, the destination holds the old or the new output whole; only
    the documented fallback has one step without it, and then the old output waits under a restorable name."""
    if has_exchange and not _exchange_supported(tmp_path):
        pytest.skip("no atomic exchange on this platform or file system")
    destination = tmp_path / "out"
    with atomic_directory(destination) as staging:
        (staging / "v").write_text("old")
    states = []

    def record():
        present = (destination / "v").read_text() if (destination / "v").exists() else None
        restorable = [p for p in tmp_path.iterdir() if (staging_owner(p) or ("", ""))[1] == "old"]
        states.append((present, len(restorable)))

    real_exchange, real_rename = atomic.exchange, pathlib.Path.rename

    def exchange_then_record(first, second):
        done = real_exchange(first, second) if has_exchange else False
        record()
        return done

    def rename_then_record(self, target):
        result = real_rename(self, target)
        record()
        return result

    monkeypatch.setattr(atomic, "exchange", exchange_then_record)
    monkeypatch.setattr(pathlib.Path, "rename", rename_then_record)
    with atomic_directory(destination, overwrite=True) as staging:
        (staging / "v").write_text("new")
    if has_exchange:
        assert states == [("new", 0)]
    else:
        assert states == [("old", 0), (None, 1), ("new", 1)]
    assert (destination / "v").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out"]


def _exchange_supported(tmp_path) -> bool:
    (tmp_path / "probe-a").mkdir()
    (tmp_path / "probe-b").mkdir()
    try:
        return exchange(tmp_path / "probe-a", tmp_path / "probe-b")
    finally:
        (tmp_path / "probe-a").rmdir()
        (tmp_path / "probe-b").rmdir()


# ---------------------------------------------------------------------------------------------------------------
# Truncated or broken safetensors checkpoints are named.


@pytest.mark.parametrize("keep", [0, 5, 40, -10])
def test_truncated_safetensors_names_the_file(tmp_path, keep):
    save_file({"x": torch.arange(64.0)}, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: keep if keep >= 0 else len(data) + keep])
    with pytest.raises(CorruptFileError) as caught:
        TensorReader(tmp_path).manifest()
    message = str(caught.value)
    assert str(tmp_path / "model.safetensors") in message and "truncated" in message and "\n" not in message
    assert caught.value.path == str(tmp_path / "model.safetensors")


def test_broken_shard_index_and_missing_shard_are_named(tiny_kit, tmp_path):
    sharded = tiny_kit.model_dir("qwen2", sharded=True)
    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    (copy / INDEX_FILE).write_text('{"weight_map": ')
    with pytest.raises(CorruptFileError, match=f"{INDEX_FILE}.*not valid JSON"):
        TensorReader(copy)
    shutil.copy(sharded / INDEX_FILE, copy / INDEX_FILE)
    shard = sorted(copy.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(MissingInputError, match=f"lists shard {shard.name}, which is not in") as caught:
        TensorReader(copy)
    assert isinstance(caught.value, FileNotFoundError)
