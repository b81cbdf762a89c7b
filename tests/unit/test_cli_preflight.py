"""``kmm preflight``'s pure parts: the body it creates, its table from a
validation's status, its exit code from the verdicts, and following a
validation until final or out of time (an injected clock and list-watch)."""

from __future__ import annotations

import asyncio
import copy
import io
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kmm import cli
from kmm.aio import clocks
from kmm.api import preflight
from kmm.cli import preflighting
from kmm.kube import errors, listwatch, objects

NAME = "preflight-x7k2p"
KERNEL = "6.1.0-27-amd64"


def verdict(namespace: str, name: str, status: str, reason: str, **extra: str) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "name": name,
        "verificationStatus": status,
        "verificationStage": "Image" if status == "InProgress" else "Done",
        "statusReason": reason,
        "lastTransitionTime": "2026-07-01T12:00:00Z",
        **extra,
    }


def validation(
    *found: dict[str, Any], generation: int = 1, observed: int | None = 1, version: str = "1"
) -> dict[str, Any]:
    status: dict[str, Any] = {"modules": list(found)}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "metadata": {"name": NAME, "generation": generation, "resourceVersion": version},
        "spec": {"kernelVersion": KERNEL, "pushBuiltImage": False},
        "status": status,
    }


EXISTS = verdict(
    "ns-b", "exists", "Success", preflight.REASON_IMAGE_EXISTS, image="reg/ns-b/exists:6.1.0"
)
NO_MAPPING = verdict("ns-a", "unmapped", "Failure", preflight.REASON_MAPPING_NOT_FOUND)
MISSING = verdict(
    "ns-a", "missing", "Failure", preflight.REASON_IMAGE_MISSING, image="reg/ns-a/missing:6.1.0"
)
BUILDING = verdict(
    "ns-c",
    "built",
    "InProgress",
    preflight.REASON_IN_PROGRESS,
    image="reg/ns-c/built:6.1.0",
    pod="preflight-x7k2p-built",
)
IN_TREE = verdict("ns-c", "in-tree", "Success", preflight.REASON_NO_IMAGE_NEEDED)
BUILD_FAILED = verdict(
    "ns-c",
    "built",
    "Failure",
    f"{preflight.REASON_BUILD_FAILED}: pod ns-c/preflight-x7k2p-built failed: [2/3] RUN make",
    image="reg/ns-c/built:6.1.0",
    pod="preflight-x7k2p-built",
)


def test_the_body_asks_for_a_generated_name_and_keeps_the_kernel_as_typed() -> None:
    created = preflighting.body("5.14.0-427.el9.x86_64+", push=True)
    assert created == {
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta2",
        "kind": "PreflightValidation",
        "metadata": {"generateName": "preflight-"},
        # The operator trims the "+", as for node kernels: not done twice here.
        "spec": {"kernelVersion": "5.14.0-427.el9.x86_64+", "pushBuiltImage": True},
    }
    assert preflighting.body(KERNEL, push=False)["spec"]["pushBuiltImage"] is False


def test_rows_one_per_module_sorted_with_mapping_image_verdict_and_reason() -> None:
    found = validation(EXISTS, NO_MAPPING, MISSING, BUILDING, IN_TREE)
    assert preflighting.rows(found) == [
        ["ns-a", "missing", "yes", "reg/ns-a/missing:6.1.0", "Failure", "verified image does not exist"],
        ["ns-a", "unmapped", "no", "-", "Failure", "mapping not found"],
        ["ns-b", "exists", "yes", "reg/ns-b/exists:6.1.0", "Success", "verified image exists"],
        [
            "ns-c",
            "built",
            "yes",
            "reg/ns-c/built:6.1.0",
            "InProgress",
            "verification is not finished yet (pod preflight-x7k2p-built)",
        ],
        ["ns-c", "in-tree", "-", "-", "Success", preflight.REASON_NO_IMAGE_NEEDED],
    ]  # fmt: skip


def test_a_reason_naming_its_pod_is_not_told_the_pod_twice() -> None:
    (row,) = preflighting.rows(validation(BUILD_FAILED))
    assert row[-1] == BUILD_FAILED["statusReason"]


def test_verdicts_for_an_older_spec_are_not_shown_nor_counted() -> None:
    stale = validation(EXISTS, generation=2, observed=1)
    assert preflighting.rows(stale) == []
    assert not preflighting.final(stale)
    assert preflighting.exit_code(validation(NO_MAPPING, generation=2), waited=True) == 2
    assert not preflighting.final(validation(EXISTS, observed=None))


@pytest.mark.parametrize(
    ("found", "code"),
    [
        (validation(EXISTS, IN_TREE), preflighting.PASSED),
        (validation(), preflighting.PASSED),  # no Modules: nothing fails
        (validation(EXISTS, NO_MAPPING), preflighting.FAILED),
        (validation(EXISTS, BUILDING), preflighting.UNFINISHED),
        # A failure is the answer, whatever is still running.
        (validation(BUILDING, MISSING), preflighting.FAILED),
        (validation(EXISTS, observed=None), preflighting.UNFINISHED),
    ],
)
def test_exit_code_after_waiting(found: dict[str, Any], code: int) -> None:
    assert preflighting.exit_code(found, waited=True) == code


@pytest.mark.parametrize("found", [validation(NO_MAPPING), validation(BUILDING), validation()])
def test_without_waiting_the_exit_code_is_zero(found: dict[str, Any]) -> None:
    assert preflighting.exit_code(found, waited=False) == 0


def test_outcome_names_each_failure_and_how_to_delete_the_validation() -> None:
    lines = preflighting.outcome_lines(
        validation(EXISTS, NO_MAPPING, MISSING), waited=True, timeout=60
    )
    assert lines == [
        "failed: ns-a/missing: verified image does not exist",
        "failed: ns-a/unmapped: mapping not found",
        f"PreflightValidation {NAME} is left in place; delete it with: "
        f"kubectl delete preflightvalidation {NAME}",
    ]


def test_outcome_names_what_the_wait_left_unfinished() -> None:
    lines = preflighting.outcome_lines(validation(EXISTS, BUILDING), waited=True, timeout=60)
    assert lines[0] == "not final after 60 s: ns-c/built"
    lines = preflighting.outcome_lines(validation(EXISTS, BUILDING), waited=False, timeout=5)
    assert lines[0].startswith("still in progress: ns-c/built (watch it: kubectl get")


def test_outcome_when_all_pass_or_the_operator_never_answered() -> None:
    lines = preflighting.outcome_lines(validation(EXISTS), waited=True, timeout=60)
    assert lines[0] == f"every Module has its image for kernel {KERNEL}"
    lines = preflighting.outcome_lines(validation(observed=None), waited=False, timeout=5)
    assert lines[0] == "the operator has not answered yet (first look: 5 s): is it running?"


def test_the_table_shows_reasons_literally_with_title_and_counts() -> None:
    console = Console(width=250, record=True)
    console.print(preflighting.table(validation(EXISTS, BUILD_FAILED)))
    text = console.export_text()
    assert "[2/3] RUN make" in text  # not taken for rich markup
    assert f"PreflightValidation {NAME}: kernel {KERNEL}" in text
    assert "1 Failure, 1 Success" in text
    header = next(line for line in text.splitlines() if "NAMESPACE" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == list(preflighting.COLUMNS)


# -- following -----------------------------------------------------------------


class Script:
    """A ``Source`` whose states a test sets."""

    def __init__(self, first: dict[str, Any]) -> None:
        self.changed = asyncio.Event()
        self.state = first
        self.problem: BaseException | None = None

    def current(self) -> dict[str, Any]:
        if self.problem is not None:
            raise self.problem
        return self.state

    def move(self, state: dict[str, Any]) -> None:
        self.state = state
        self.changed.set()


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_follow_shows_each_state_and_stops_when_final() -> None:
    clock = clocks.FakeClock()
    script = Script(validation(observed=None))
    shown: list[list[list[str]]] = []
    following = asyncio.ensure_future(
        preflighting.follow(
            script, timeout=60, clock=clock, show=lambda v: shown.append(preflighting.rows(v))
        )
    )
    await turns()
    script.move(validation(EXISTS, BUILDING))
    await turns()
    clock.advance(59)
    await turns()
    assert not following.done()
    script.move(validation(EXISTS, BUILD_FAILED))
    found = await following
    assert preflighting.exit_code(found, waited=True) == preflighting.FAILED
    assert [[row[4] for row in rows] for rows in shown] == [
        [],
        ["Success", "InProgress"],
        ["Success", "Failure"],
    ]


async def test_follow_returns_the_last_state_when_time_runs_out() -> None:
    clock = clocks.FakeClock()
    script = Script(validation(EXISTS, BUILDING))
    following = asyncio.ensure_future(
        preflighting.follow(script, timeout=60, clock=clock, show=lambda _: None)
    )
    await turns()
    clock.advance(59.5)
    await turns()
    assert not following.done()
    clock.advance(0.5)
    found = await following
    assert preflighting.exit_code(found, waited=True) == preflighting.UNFINISHED
    assert clock.pending == 0  # its timer is gone with it


async def test_follow_does_not_wait_for_what_is_final_already() -> None:
    clock = clocks.FakeClock()
    found = await preflighting.follow(
        Script(validation(EXISTS)), timeout=60, clock=clock, show=lambda _: None
    )
    assert preflighting.exit_code(found, waited=True) == preflighting.PASSED
    assert clock.now() == 0


async def test_follow_raises_what_the_source_cannot_follow() -> None:
    script = Script(validation(BUILDING))
    following = asyncio.ensure_future(
        preflighting.follow(script, timeout=60, clock=clocks.FakeClock(), show=lambda _: None)
    )
    await turns()
    script.problem = preflighting.Gone("deleted")
    script.changed.set()
    with pytest.raises(preflighting.Gone):
        await following


async def test_on_a_terminal_the_table_is_refreshed_in_place_until_final() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    clock = clocks.FakeClock()
    script = Script(validation(observed=None))
    following = asyncio.ensure_future(
        preflighting.displayed(script, timeout=60, clock=clock, console=console)
    )
    await turns(20)
    script.move(validation(EXISTS, BUILDING))
    await turns(20)
    assert "verification is not finished yet (pod preflight-x7k2p-built)" in out.getvalue()
    script.move(validation(EXISTS, BUILD_FAILED))
    await following
    drawn = out.getvalue()
    # Each frame erases the last one (cursor up, clear line); the last frame stays,
    # ended by a newline before the cursor is shown again.
    last = drawn[drawn.rindex("\x1b[2K") :]
    assert "[2/3] RUN make" in last
    assert "1 Failure, 1 Success" in last
    assert "InProgress" not in last
    assert drawn.endswith("\n\x1b[?25h")


# -- Watched: a reflector over a list-watch ------------------------------------------


class Lister:
    """A ``listwatch.ListWatch`` answering from memory: each list the next
    of ``lists`` (or an error), each watch the events a test queues."""

    def __init__(self, *lists: list[dict[str, Any]] | errors.ApiError) -> None:
        self.lists = list(lists)
        self.events: asyncio.Queue[listwatch.WatchEvent | None] = asyncio.Queue()
        self.selectors: list[str | None] = []

    async def list_page(
        self,
        *,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        continue_token: str | None,
    ) -> listwatch.ListPage:
        self.selectors.append(field_selector)
        answer = self.lists.pop(0)
        if isinstance(answer, errors.ApiError):
            raise answer
        return listwatch.ListPage(items=answer, resource_version="1", continue_token=None)

    async def watch(
        self,
        *,
        resource_version: str,
        label_selector: str | None,
        field_selector: str | None,
        timeout_seconds: int,
    ) -> AsyncGenerator[listwatch.WatchEvent, None]:
        while (event := await self.events.get()) is not None:
            yield event


def created() -> dict[str, Any]:
    found = validation(observed=None)
    del found["status"]
    return found


async def test_watched_follows_the_validation_until_final() -> None:
    first = validation(EXISTS, BUILDING, version="2")
    lister = Lister([first])
    async with preflighting.Watched(lister, created()) as source:
        following = asyncio.ensure_future(
            preflighting.follow(source, timeout=60, clock=clocks.FakeClock(), show=lambda _: None)
        )
        await turns(20)
        assert lister.selectors == [f"metadata.name={NAME}"]
        assert source.current() == first
        # A bookmark, or the same version again, is no news.
        source.changed.clear()
        lister.events.put_nowait(
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}}
        )
        lister.events.put_nowait({"type": "MODIFIED", "object": copy.deepcopy(first)})
        await turns(20)
        assert not source.changed.is_set()
        done = validation(EXISTS, BUILD_FAILED, version="4")
        lister.events.put_nowait({"type": "MODIFIED", "object": done})
        found = await following
    assert objects.resource_version(found) == "4"
    assert preflighting.exit_code(found, waited=True) == preflighting.FAILED


@pytest.mark.parametrize("how", ["deleted", "listed-empty"])
async def test_watched_says_when_the_validation_was_deleted(how: str) -> None:
    lister = Lister([] if how == "listed-empty" else [validation(BUILDING, version="2")])
    async with preflighting.Watched(lister, created()) as source:
        following = asyncio.ensure_future(
            preflighting.follow(source, timeout=60, clock=clocks.FakeClock(), show=lambda _: None)
        )
        await turns(20)
        if how == "deleted":
            lister.events.put_nowait({"type": "DELETED", "object": validation(BUILDING)})
        with pytest.raises(preflighting.Gone, match=f"PreflightValidation {NAME} was deleted"):
            await following


async def test_watched_retries_a_passing_outage_and_gives_up_on_a_refusal() -> None:
    clock = clocks.FakeClock()
    lister = Lister(
        errors.Unavailable(503, "restarting"),
        errors.Forbidden(403, "cannot list preflightvalidations", reason="Forbidden"),
    )
    async with preflighting.Watched(lister, created(), clock=clock) as source:
        following = asyncio.ensure_future(
            preflighting.follow(source, timeout=60, clock=clock, show=lambda _: None)
        )
        await turns(20)
        assert not following.done()  # 503: try again after a back-off
        clock.advance(5)
        with pytest.raises(errors.Forbidden):
            await following


# -- the command ---------------------------------------------------------------------


def test_preflight_is_a_command_with_the_documented_options() -> None:
    result = CliRunner().invoke(
        cli.build("preflight"), ["preflight", "--help"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    for option in ("--kernel", "--push", "--wait", "--timeout", "--kubeconfig", "--context"):
        assert option in result.output
    everything = CliRunner().invoke(cli.build(), ["--help"], env={"COLUMNS": "200"})
    assert " preflight " in everything.output


def test_preflight_needs_a_kernel() -> None:
    result = CliRunner().invoke(cli.build("preflight"), ["preflight"])
    assert result.exit_code == 2
    assert "--kernel" in result.output
