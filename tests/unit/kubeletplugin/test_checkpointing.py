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
    names = sorted(p.name for p in again.path.parent.iterdir())
    assert names == [checkpointing.JOURNAL_NAME, checkpointing.FILE_NAME]  # no temporary file
    checkpoint.close()


def test_saves_reencode_only_changed_records_and_write_the_same_bytes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = checkpointing.Checkpoint(tmp_path)
    encoded: list[str] = []
    to_dict = checkpointing.ClaimRecord.to_dict

    def counted(self: checkpointing.ClaimRecord) -> dict[str, object]:
        encoded.append(self.name)
        return to_dict(self)

    monkeypatch.setattr(checkpointing.ClaimRecord, "to_dict", counted)

    def reference() -> str:
        # The format as written before records were cached: one json.dumps.
        payload: dict[str, object] = {
            "claims": {u: to_dict(r) for u, r in checkpoint.claims.items()}
        }
        if checkpoint.boot_id is not None:
            payload["bootID"] = checkpoint.boot_id
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    for i in range(3):
        uid = claims.ClaimUID(f"u-{i}\u00e9")  # escaped as json.dumps escapes it
        checkpoint.claims[uid] = checkpointing.ClaimRecord("ns", f"c{i}", checkpointing.STARTED)
    checkpoint.save()
    assert json.loads(checkpoint.path.read_text())["data"] == reference()
    assert sorted(encoded) == ["c0", "c1", "c2"]
    encoded.clear()
    checkpoint.claims[claims.ClaimUID("u-1\u00e9")] = record(checkpointing.COMPLETED)
    del checkpoint.claims[claims.ClaimUID("u-2\u00e9")]
    checkpoint.save()
    assert encoded == ["c"]  # only the record that changed
    assert json.loads(checkpoint.path.read_text())["data"] == reference()
    checkpoint.boot_id = "0b5e\u00e9"
    checkpoint.save()
    assert json.loads(checkpoint.path.read_text())["data"] == reference()
    again = checkpointing.Checkpoint(tmp_path)
    again.load()
    assert (again.boot_id, again.claims) == (checkpoint.boot_id, checkpoint.claims)


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


# Written by the build before ReleasePending (commit 74fc886), byte for byte.
_BEFORE_RELEASE_PENDING = {
    checkpointing.FILE_NAME: (
        r'{"version": 1, "checksum": 1002610470, "data": "{\"bootID\":\"boot-1\",\"claims\":'
        r"{\"u-1\":{\"devices\":[{\"cdiDeviceIDs\":[\"v/claim=u-1-0\"],\"deviceName\":\"dev0\","
        r"\"edits\":{\"deviceNodes\":[{\"path\":\"/dev/dev0\"}]},\"poolName\":\"node\","
        r"\"requestNames\":[\"r\"]}],\"name\":\"c1\",\"namespace\":\"ns\","
        r'\"state\":\"PrepareCompleted\"}}}"}'
    ),
    checkpointing.JOURNAL_NAME: (
        'eee7ff4a {"journal":1,"bootID":"boot-1"}\n'
        '1bc4a43f {"drop":[],"put":{"u-2":{"devices":[],"name":"c2","namespace":"ns",'
        '"state":"PrepareStarted"}}}\n'
    ),
}


def test_a_checkpoint_written_before_release_pending_still_loads(tmp_path: pathlib.Path) -> None:
    for name, text in _BEFORE_RELEASE_PENDING.items():
        (tmp_path / name).write_text(text)
    checkpoint = checkpointing.Checkpoint(tmp_path)
    checkpoint.load(boot_id="boot-1")
    device = checkpointing.PreparedDevice(
        ("r",), "node", "dev0", ("v/claim=u-1-0",), {"deviceNodes": [{"path": "/dev/dev0"}]}
    )
    assert checkpoint.boot_id == "boot-1"
    assert checkpoint.claims == {
        "u-1": checkpointing.ClaimRecord("ns", "c1", checkpointing.COMPLETED, (device,)),
        "u-2": checkpointing.ClaimRecord("ns", "c2", checkpointing.STARTED),
    }


def test_a_pending_release_round_trips_through_the_journal_and_the_snapshot(
    tmp_path: pathlib.Path,
) -> None:
    checkpoint = checkpointing.Checkpoint(tmp_path)
    pending = checkpointing.ClaimRecord("ns", "c", checkpointing.RELEASE_PENDING)
    checkpoint.commit(put={UID: pending})
    checkpoint.close()
    again = checkpointing.Checkpoint(tmp_path)
    again.load()
    assert again.claims == {UID: pending}  # from the journal
    again.save()
    again.close()
    third = checkpointing.Checkpoint(tmp_path)
    third.load()
    assert third.claims == {UID: pending}  # from the snapshot
    assert json.loads(third.path.read_text())["version"] == 1  # the version stayed
    third.close()
