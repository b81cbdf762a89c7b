"""The checkpoint's journal: replay, what a crash leaves, and what damage is."""

from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmm.kubeletplugin import checkpointing, claimcache, claims, errors, journaling, plugins

from . import fakes
from .test_checkpointing import record

UIDS = [claims.ClaimUID(f"uid-{i}") for i in range(4)]


def journal_of(checkpoint: checkpointing.Checkpoint) -> pathlib.Path:
    return checkpoint.journal.path


def started_then_completed(directory: pathlib.Path) -> checkpointing.Checkpoint:
    """A checkpoint with a snapshot, then two changes in its journal."""
    checkpoint = checkpointing.Checkpoint(directory)
    checkpoint.boot_id = "boot-1"
    checkpoint.save()
    checkpoint.commit(put={UIDS[0]: record(checkpointing.STARTED)})
    checkpoint.commit(put={UIDS[0]: record(checkpointing.COMPLETED)})
    checkpoint.close()
    return checkpoint


def loaded(directory: pathlib.Path, boot_id: str | None = None) -> checkpointing.Checkpoint:
    checkpoint = checkpointing.Checkpoint(directory)
    checkpoint.load(boot_id=boot_id)
    return checkpoint


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.sampled_from(UIDS),
            st.sampled_from([checkpointing.STARTED, checkpointing.COMPLETED]),
        ),
        st.tuples(st.just("drop"), st.sampled_from(UIDS), st.none()),
        st.tuples(st.just("save"), st.none(), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_what_is_loaded_is_what_was_committed(ops: list[tuple[str, object, object]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = checkpointing.Checkpoint(pathlib.Path(directory))
        for op, uid, state in ops:
            if op == "put":
                checkpoint.commit(put={uid: record(state)})  # type: ignore[dict-item, arg-type]
            elif op == "drop":
                checkpoint.commit(drop=[uid])  # type: ignore[list-item]
            else:
                checkpoint.save()
        checkpoint.close()
        assert loaded(pathlib.Path(directory)).claims == checkpoint.claims


def test_a_line_a_killed_process_did_not_finish_is_dropped(tmp_path: pathlib.Path) -> None:
    checkpoint = started_then_completed(tmp_path)
    line = journaling.frame('{"drop":["uid-0"],"put":{}}')
    with journal_of(checkpoint).open("ab") as journal:
        journal.write(line[: len(line) // 2])
    again = checkpointing.Checkpoint(tmp_path)
    reading = again.load(boot_id="boot-1")  # the same boot: nothing else is forgiven
    assert reading is not None
    assert (reading.dropped, reading.torn) == (1, False)
    assert again.claims == {UIDS[0]: record(checkpointing.COMPLETED)}


def test_a_damaged_line_within_one_boot_is_reported_and_kept(tmp_path: pathlib.Path) -> None:
    checkpoint = started_then_completed(tmp_path)
    path = journal_of(checkpoint)
    damaged = path.read_bytes().replace(b"PrepareCompleted", b"PrepareCompletes")
    path.write_bytes(damaged)
    with pytest.raises(errors.CheckpointCorruptedError) as caught:
        loaded(tmp_path, boot_id="boot-1")
    assert caught.value.path == path
    assert "line 3 fails its checksum" in str(caught.value)
    with pytest.raises(errors.CheckpointCorruptedError):
        loaded(tmp_path)  # strict without a boot too
    assert path.read_bytes() == damaged


def test_a_well_framed_but_malformed_change_is_reported(tmp_path: pathlib.Path) -> None:
    checkpoint = started_then_completed(tmp_path)
    with journal_of(checkpoint).open("ab") as journal:
        journal.write(journaling.frame('{"drop":[],"put":{"uid-9":{"state":"Sideways"}}}'))
    with pytest.raises(errors.CheckpointCorruptedError, match="line 4: malformed change"):
        loaded(tmp_path, boot_id="boot-1")


def test_an_unreadable_header_is_reported(tmp_path: pathlib.Path) -> None:
    checkpoint = started_then_completed(tmp_path)
    path = journal_of(checkpoint)
    path.write_bytes(b"00000000 {}\n" + path.read_bytes().split(b"\n", 1)[1])
    with pytest.raises(errors.CheckpointCorruptedError, match="unreadable header"):
        loaded(tmp_path, boot_id="boot-2")


def test_after_a_reboot_the_torn_end_is_dropped(tmp_path: pathlib.Path) -> None:
    checkpoint = started_then_completed(tmp_path)
    path = journal_of(checkpoint)
    head, started, completed, _ = path.read_bytes().split(b"\n")
    # Unsynced pages reach the disk in any order: a later line may survive
    # an earlier one that came back as zeros.
    path.write_bytes(b"\n".join([head, started, b"\0" * len(completed), completed, b""]))
    again = checkpointing.Checkpoint(tmp_path)
    reading = again.load(boot_id="boot-2")
    assert reading is not None
    assert (reading.dropped, reading.torn) == (2, True)
    assert again.claims == {UIDS[0]: record(checkpointing.STARTED)}
    assert again.boot_id == "boot-1"  # the boot that began the journal


def _failing_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next write stores half its bytes, the one after finds the disk full."""
    real_write = os.write
    script = ["half", "full"]

    def write(fd: int, data: bytes | memoryview) -> int:
        step = script.pop(0) if script else None
        if step == "half":
            return real_write(fd, bytes(data[: len(data) // 2]))
        if step == "full":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_failed_append_leaves_the_journal_and_the_memory_as_they_were(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = started_then_completed(tmp_path)
    checkpoint.save()
    path = journal_of(checkpoint)
    before, claims_before = path.read_bytes(), dict(checkpoint.claims)
    _failing_write(monkeypatch)
    with pytest.raises(errors.CheckpointError, match="No space left on device"):
        checkpoint.commit(drop=[UIDS[0]])
    assert path.read_bytes() == before  # cut back to its last whole line
    assert checkpoint.claims == claims_before
    checkpoint.commit(drop=[UIDS[0]])  # space is back
    checkpoint.close()
    assert loaded(tmp_path, boot_id="boot-1").claims == {}


def test_a_journal_that_cannot_be_cut_back_is_begun_anew(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = started_then_completed(tmp_path)
    checkpoint.save()
    _failing_write(monkeypatch)

    def ftruncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    with pytest.raises(errors.CheckpointError):
        checkpoint.commit(put={UIDS[1]: record(checkpointing.STARTED)})
    assert not checkpoint.journal.is_open
    monkeypatch.undo()
    checkpoint.commit(put={UIDS[1]: record(checkpointing.STARTED)})
    checkpoint.close()
    # The half line is gone with the old journal; the new one replays cleanly.
    again = loaded(tmp_path, boot_id="boot-1")
    assert again.claims == {
        UIDS[0]: record(checkpointing.COMPLETED),
        UIDS[1]: record(checkpointing.STARTED),
    }


def test_a_crash_between_snapshot_and_new_journal_replays_to_the_same_state(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = started_then_completed(tmp_path)
    checkpoint.commit(drop=[UIDS[0]])
    checkpoint.commit(put={UIDS[1]: record(checkpointing.STARTED)})

    def crash(self: journaling.Journal, boot_id: str | None) -> None:
        raise OSError(errno.EIO, "killed")

    monkeypatch.setattr(journaling.Journal, "begin", crash)
    with pytest.raises(errors.CheckpointError):
        checkpoint.save()  # the new snapshot is written, the old journal stays
    monkeypatch.undo()
    checkpoint.close()
    assert loaded(tmp_path, boot_id="boot-1").claims == checkpoint.claims


async def test_a_plugin_keeps_a_journal_torn_by_a_reboot_aside(
    root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = plugins.Paths.under(root, fakes.DRIVER)
    started_then_completed(paths.plugin_data_dir)
    journal = paths.plugin_data_dir / checkpointing.JOURNAL_NAME
    torn = journal.read_bytes()[:-20] + b"\0" * 19 + b"\n"
    journal.write_bytes(torn)
    policy = fakes.FakePolicy()
    plugin = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=policy,
        claim_source=claimcache.StaticClaims(),
        paths=paths, boot_id="boot-2",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        await plugin.start()
    await plugin.stop()
    assert journal.with_name(f"{journal.name}.torn").read_bytes() == torn
    assert "1 checkpoint changes" in caplog.text
    assert plugin.prepared()[UIDS[0]].state == checkpointing.STARTED
    assert policy.restored == {}
    # The new journal is whole and of this boot.
    header = json.loads(journal.read_bytes().split(b" ", 1)[1])
    assert header == {"journal": journaling.VERSION, "bootID": "boot-2"}


async def test_a_plugin_refuses_to_start_on_a_journal_damaged_in_its_boot(
    root: pathlib.Path,
) -> None:
    paths = plugins.Paths.under(root, fakes.DRIVER)
    started_then_completed(paths.plugin_data_dir)
    journal = paths.plugin_data_dir / checkpointing.JOURNAL_NAME
    damaged = journal.read_bytes().replace(b"PrepareStarted", b"PrepareStartex")
    journal.write_bytes(damaged)
    plugin = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
        claim_source=claimcache.StaticClaims(), paths=paths, boot_id="boot-1",
    )  # fmt: skip
    with pytest.raises(errors.CheckpointCorruptedError, match="line 2"):
        await plugin.start()
    assert not plugin.started
    assert journal.read_bytes() == damaged
    assert not journal.with_name(f"{journal.name}.torn").exists()
