from __future__ import annotations

import json
import pathlib
import zlib

import pytest

from kmm.kubeletplugin import checkpointing, claims, errors

UID = claims.ClaimUID("abc-123")


def record(state: checkpointing.State) -> checkpointing.ClaimRecord:
    device = checkpointing.PreparedDevice(
        request_names=("r",),
        pool_name="node",
        device_name="dev0",
        cdi_device_ids=("v/claim=abc-123-0",),
        edits={"deviceNodes": [{"path": "/dev/dev0"}]},
    )
    return checkpointing.ClaimRecord("ns", "c", state, (device,))


def test_round_trip(tmp_path: pathlib.Path) -> None:
    checkpoint = checkpointing.Checkpoint(tmp_path / "plugin")
    checkpoint.claims[UID] = record(checkpointing.COMPLETED)
    checkpoint.save()
    again = checkpointing.Checkpoint(tmp_path / "plugin")
    again.load()
    assert again.claims == checkpoint.claims
    envelope = json.loads(again.path.read_text())
    assert envelope["version"] == checkpointing.VERSION
    assert envelope["checksum"] == zlib.crc32(envelope["data"].encode())
    assert [p.name for p in again.path.parent.iterdir()] == [checkpointing.FILE_NAME]


def test_missing_file_is_empty(tmp_path: pathlib.Path) -> None:
    checkpoint = checkpointing.Checkpoint(tmp_path)
    checkpoint.load()
    assert checkpoint.claims == {}


def _valid(tmp_path: pathlib.Path) -> pathlib.Path:
    checkpoint = checkpointing.Checkpoint(tmp_path)
    checkpoint.claims[UID] = record(checkpointing.STARTED)
    checkpoint.save()
    return checkpoint.path


@pytest.mark.parametrize(
    ("mangle", "problem"),
    [
        (lambda text: text[: len(text) // 2], "not JSON"),
        (lambda text: text.replace('"version": 1', '"version": 9'), "unsupported version 9"),
        (lambda text: text.replace("dev0", "dev1"), "checksum mismatch"),
        (lambda text: "[]", "not a JSON object"),
    ],
)
def test_corruption_is_reported_with_file_and_problem(
    tmp_path: pathlib.Path, mangle: object, problem: str
) -> None:
    path = _valid(tmp_path)
    corrupted = mangle(path.read_text())  # type: ignore[operator]
    path.write_text(corrupted)
    with pytest.raises(errors.CheckpointCorruptedError) as caught:
        checkpointing.Checkpoint(tmp_path).load()
    assert caught.value.path == path
    assert problem in str(caught.value)
    assert str(path) in str(caught.value)
    assert path.read_text() == corrupted  # never replaced


def test_well_checksummed_but_malformed_content(tmp_path: pathlib.Path) -> None:
    path = tmp_path / checkpointing.FILE_NAME
    data = json.dumps({"claims": {"x": {"state": "Sideways", "namespace": "", "name": ""}}})
    path.write_text(json.dumps({"version": 1, "checksum": zlib.crc32(data.encode()), "data": data}))
    with pytest.raises(errors.CheckpointCorruptedError, match="malformed content"):
        checkpointing.Checkpoint(tmp_path).load()
