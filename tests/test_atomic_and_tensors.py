import json

import pytest
import torch
from safetensors.torch import save_file

from kinfolk.atomic import (
    OutputExistsError,
    atomic_directory,
    atomic_file,
    directory_fingerprint,
    fingerprint,
    write_json,
)
from kinfolk.tensors import INDEX_FILE, ShardedWriter, TensorReader


def test_failed_block_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "out") as staging:
        (staging / "half.txt").write_text("partial")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_existing_destination_is_refused_then_replaced(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--overwrite"), atomic_directory(tmp_path / "out"):
        pass
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
