"""``kmm preflight``: would every Module have its image on a kernel the nodes do not run yet?

``kmm preflight --kernel VERSION`` creates a cluster-scoped
``PreflightValidation`` (``generateName: preflight-``, ``kernelVersion`` as
typed: the operator trims a trailing ``+`` as it does for node kernels) and
shows the operator's answer, one row per Module: NAMESPACE, MODULE, MAPPING
(``yes`` a kernel mapping matched, ``no`` none did, ``-`` the Module needs
no image or the operator has not said), IMAGE, VERDICT and REASON (with the
preflight pod while one runs). After the table it names each Module that
failed and, always, the validation it left in place and how to delete it.

Nothing is judged here: the verdicts are the operator's
(``status.modules``), read only once ``status.observedGeneration`` says
they answer the spec this command wrote. A validation is *final* when they
do and every verdict is Success or Failure.

- ``--wait``: a live table, refreshed from a watch of the validation (a
  ``kube.reflecting.Reflector`` on its name), until it is final or
  ``--timeout`` seconds passed. Exit 0 when every Module is Success (no
  Modules at all included), 1 when any is Failure (even when others were
  still running as the wait ran out: the answer is no either way), 2 when
  the wait ran out with none failed and some not final.
- Without ``--wait``: a first look of at most ``FIRST_LOOK`` seconds (fewer
  when the answer is final sooner), so the operator has a moment to answer
  what needs no build; then the table as found, and exit 0.
- The cluster refusing the validation (a ``kernelVersion`` admission
  refuses: its message names the field), or an API error while following
  it, or the validation deleted meanwhile: its message on stderr, exit
  ``ERROR`` (3), no traceback. A usage error is click's exit 2; Ctrl-C
  exits 130. Whenever the validation was created, its name and how to
  delete it are said.

The pure parts (``rows``, ``final``, ``exit_code``, ``follow`` and
``displayed`` with an injected clock and source) are what the unit tests
drive; ``Watched`` is the source the command follows a real validation with.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, Protocol

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kmm.aio import clocks, tasks
from kmm.api import preflight
from kmm.cli import clients, tables
from kmm.kube import client, errors, listwatch, objects, reflecting, resources

__all__ = [
    "COLUMNS",
    "DEFAULT_TIMEOUT",
    "ERROR",
    "FAILED",
    "FIRST_LOOK",
    "GENERATE_NAME",
    "PASSED",
    "UNFINISHED",
    "Gone",
    "Source",
    "Watched",
    "body",
    "displayed",
    "exit_code",
    "final",
    "follow",
    "outcome_lines",
    "preflight_command",
    "register",
    "rows",
    "table",
    "verdicts",
]

RESOURCE: Final = resources.Resource(
    preflight.GROUP, preflight.VERSION, preflight.PLURAL, namespaced=False
)
GENERATE_NAME: Final = "preflight-"
COLUMNS: Final = ("NAMESPACE", "MODULE", "MAPPING", "IMAGE", "VERDICT", "REASON")
# Seconds: long enough for a cluster's worth of image lookups, short enough
# for a command that was not asked to wait.
FIRST_LOOK: Final = 5.0
DEFAULT_TIMEOUT: Final = 1800.0  # seconds; builds and signs of a few Modules

PASSED: Final = 0
FAILED: Final = 1
UNFINISHED: Final = 2
ERROR: Final = 3

_SUCCESS: Final = "Success"
_FAILURE: Final = "Failure"
_FINAL: Final = frozenset({_SUCCESS, _FAILURE})


class Gone(errors.KubeError):
    """The validation was deleted while this command followed it."""


def body(kernel: str, *, push: bool) -> objects.RawObject:
    """The validation to create. Not checked here: admission is the judge,
    and its message is the one the user sees."""
    return {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "metadata": {"generateName": GENERATE_NAME},
        "spec": {"kernelVersion": kernel, "pushBuiltImage": push},
    }


# -- reading a validation (pure) -------------------------------------------


def _status(validation: Mapping[str, Any]) -> Mapping[str, Any]:
    found = validation.get("status")
    return found if isinstance(found, Mapping) else {}


def answered(validation: Mapping[str, Any]) -> bool:
    """The operator's verdicts are for the spec as it is now."""
    generation = (validation.get("metadata") or {}).get("generation")
    observed = _status(validation).get("observedGeneration")
    return generation is not None and observed == generation


def verdicts(validation: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``status.modules`` by namespace and name; none until ``answered``
    (verdicts for an older spec do not answer this one)."""
    if not answered(validation):
        return []
    found = [v for v in _status(validation).get("modules") or () if isinstance(v, Mapping)]
    return sorted(found, key=lambda v: (str(v.get("namespace")), str(v.get("name"))))


def final(validation: Mapping[str, Any]) -> bool:
    """Answered, and no verdict is still in progress."""
    return answered(validation) and all(
        v.get("verificationStatus") in _FINAL for v in verdicts(validation)
    )


def _mapping_cell(verdict: Mapping[str, Any]) -> str:
    # The operator writes `image` exactly when a mapping gave one.
    if verdict.get("image"):
        return "yes"
    if str(verdict.get("statusReason") or "").startswith(preflight.REASON_MAPPING_NOT_FOUND):
        return "no"
    return "-"


def _reason_cell(verdict: Mapping[str, Any]) -> str:
    reason = str(verdict.get("statusReason") or "-")
    pod = verdict.get("pod")
    if pod and str(pod) not in reason:
        reason += f" (pod {pod})"
    return reason


def rows(validation: Mapping[str, Any]) -> list[list[str]]:
    """One row per Module, in ``COLUMNS`` order."""
    return [
        [
            str(v.get("namespace") or "-"),
            str(v.get("name") or "-"),
            _mapping_cell(v),
            str(v.get("image") or "-"),
            str(v.get("verificationStatus") or "-"),
            _reason_cell(v),
        ]
        for v in verdicts(validation)
    ]


def _kernel(validation: Mapping[str, Any]) -> str:
    return str((validation.get("spec") or {}).get("kernelVersion") or "")


def _caption(validation: Mapping[str, Any]) -> str:
    if not answered(validation):
        return "waiting for the operator's answer"
    counts: dict[str, int] = {}
    for v in verdicts(validation):
        status = str(v.get("verificationStatus"))
        counts[status] = counts.get(status, 0) + 1
    if not counts:
        return "no Modules in the cluster"
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def table(validation: Mapping[str, Any]) -> Table:
    """The table the command prints (and refreshes while it waits)."""
    found = Table(
        *COLUMNS,
        title=f"PreflightValidation {objects.name(validation)}: kernel {_kernel(validation)}",
        caption=_caption(validation),
    )
    for row in rows(validation):
        # Text: a reason's "[...]" (a build's log lines) is not rich markup.
        found.add_row(*(Text(cell) for cell in row))
    return found


def exit_code(validation: Mapping[str, Any], *, waited: bool) -> int:
    """``PASSED``, ``FAILED`` or ``UNFINISHED`` for a ``--wait`` that ended on
    ``validation``; ``PASSED`` without ``--wait`` (what was found was shown)."""
    if not waited:
        return PASSED
    if any(v.get("verificationStatus") == _FAILURE for v in verdicts(validation)):
        return FAILED
    return PASSED if final(validation) else UNFINISHED


def outcome_lines(validation: Mapping[str, Any], *, waited: bool, timeout: float) -> list[str]:
    """What follows the table: each failure named, what is unfinished, and
    the validation left in place."""
    name = objects.name(validation)
    kernel = _kernel(validation)
    found = verdicts(validation)
    failed = [v for v in found if v.get("verificationStatus") == _FAILURE]
    going = [v for v in found if v.get("verificationStatus") not in _FINAL]
    lines: list[str] = []
    for v in failed:
        lines.append(f"failed: {v.get('namespace')}/{v.get('name')}: {_reason_cell(v)}")
    if not answered(validation):
        lines.append(
            f"the operator has not answered yet ({'--timeout' if waited else 'first look'}: "
            f"{timeout:g} s): is it running?"
        )
    elif going:
        said = "; ".join(f"{v.get('namespace')}/{v.get('name')}" for v in going)
        lines.append(
            f"not final after {timeout:g} s: {said}"
            if waited
            else f"still in progress: {said} (watch it: kubectl get preflightvalidation {name} "
            "-o yaml --watch)"
        )
    elif not failed:
        lines.append(
            f"every Module has its image for kernel {kernel}" if found else "no Modules to validate"
        )
    lines.append(_left_in_place(name))
    return lines


# -- following a validation ------------------------------------------------


class Source(Protocol):
    """The validation as last seen. ``changed`` is set when ``current`` has
    news; ``current`` raises once the validation cannot be followed (deleted,
    or the watch refused)."""

    changed: asyncio.Event

    def current(self) -> objects.RawObject: ...


async def follow(
    source: Source,
    *,
    timeout: float,
    clock: clocks.Clock,
    show: Callable[[objects.RawObject], None],
) -> objects.RawObject:
    """Show each state of the validation until it is ``final`` or ``timeout``
    seconds of ``clock`` passed; the last state seen."""
    ran_out = asyncio.Event()
    timer = clock.call_at(clock.now() + timeout, ran_out.set)
    try:
        while True:
            source.changed.clear()
            found = source.current()
            show(found)
            if final(found) or ran_out.is_set():
                return found
            await tasks.wait_first(source.changed, ran_out)
    finally:
        timer.cancel()


async def displayed(
    source: Source, *, timeout: float, clock: clocks.Clock, console: Console | None
) -> objects.RawObject:
    """``follow`` with its table refreshed in place on ``console`` (a
    terminal), or shown nowhere (None: the caller prints the end state)."""
    if console is None:
        return await follow(source, timeout=timeout, clock=clock, show=lambda _: None)
    with Live(table(source.current()), console=console, auto_refresh=False) as display:
        return await follow(
            source,
            timeout=timeout,
            clock=clock,
            show=lambda latest: display.update(table(latest), refresh=True),
        )


class Watched:
    """``Source`` of one validation, kept current by a reflector on its name
    over ``source`` (``listwatch.ApiListWatch`` of ``RESOURCE``; tests give
    their own): it lists and watches, resumes and relists as the operator's
    caches do.
    A refusal that retrying cannot cure (403, 404) ends the following."""

    def __init__(
        self,
        source: listwatch.ListWatch,
        created: objects.RawObject,
        *,
        clock: clocks.Clock | None = None,
    ) -> None:
        self.changed = asyncio.Event()
        self._latest = created
        self._name = objects.name(created)
        self._problem: BaseException | None = None
        self._reflector = reflecting.Reflector(
            f"preflightvalidation {self._name}",
            source,
            self,
            field_selector=f"metadata.name={self._name}",
            clock=clock,
            on_retry=self._refused,
        )
        self._tasks = tasks.TaskSet("kmm preflight", on_error=self._failed)

    async def __aenter__(self) -> Watched:
        self._tasks.spawn(self._reflector.run(), name="watch")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.close()

    def current(self) -> objects.RawObject:
        if self._problem is not None:
            raise self._problem
        return self._latest

    # reflecting.Sink
    def replace(self, items: list[objects.RawObject], resource_version: str) -> None:
        if not items:
            self._gone()
        else:
            self._seen(items[0])

    def apply(self, event: listwatch.WatchEvent) -> None:
        if event["type"] == "DELETED":
            self._gone()
        elif event["type"] != "BOOKMARK":
            self._seen(event["object"])

    def _seen(self, found: objects.RawObject) -> None:
        if objects.resource_version(found) != objects.resource_version(self._latest):
            self._latest = found
            self.changed.set()

    def _gone(self) -> None:
        self._stop(Gone(f"PreflightValidation {self._name} was deleted while waiting for it"))

    def _refused(self, error: errors.ApiError) -> None:
        if not error.retriable:
            self._stop(error)

    def _failed(self, error: BaseException, what: str) -> None:
        self._stop(error)

    def _stop(self, problem: BaseException) -> None:
        if self._problem is None:
            self._problem = problem
        self.changed.set()


# -- the command -------------------------------------------------------------


@dataclasses.dataclass
class _Created:
    """The validation's name once created: every way out names it."""

    name: str | None = None


async def _run(
    api: client.Client,
    kernel: str,
    *,
    push: bool,
    live: bool,
    timeout: float,
    console: Console,
    created: _Created,
) -> objects.RawObject:
    async with api:
        found: objects.RawObject = await api.request(
            "POST", RESOURCE.path(), body=body(kernel, push=push)
        )
        created.name = objects.name(found)
        console.print(f"created PreflightValidation {created.name}", highlight=False)
        async with Watched(listwatch.ApiListWatch(api, RESOURCE), found) as source:
            return await displayed(
                source, timeout=timeout, clock=clocks.LoopClock(), console=console if live else None
            )


def _left_in_place(name: str) -> str:
    return (
        f"PreflightValidation {name} is left in place; delete it with: "
        f"kubectl delete preflightvalidation {name}"
    )


def preflight_command(
    kernel: Annotated[
        str,
        typer.Option(
            "--kernel",
            help="The kernel to validate every Module against, as `uname -r` prints it "
            "(e.g. 6.1.0-27-amd64).",
        ),
    ],
    push: Annotated[
        bool,
        typer.Option(
            "--push",
            help="Push the images built and signed for it under the Modules' own names "
            "(pushBuiltImage); without, nothing is pushed.",
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Show a live table until every verdict is final; exit 0 all Success, "
            "1 any Failure, 2 --timeout ran out.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds --wait waits at most (without --wait: the first look, at most 5 s).",
        ),
    ] = DEFAULT_TIMEOUT,
    kubeconfig: clients.KubeconfigOption = None,
    context: clients.ContextOption = None,
) -> None:
    """Ask the operator whether every Module has (or can build) its image for a kernel.

    Creates a PreflightValidation and shows one row per Module: whether a kernel mapping
    matched, the image, the verdict and why. Without --wait, it looks for up to 5 s, prints
    what it found and exits 0. The validation is left in place; the last line says how to
    delete it. Exit 3: the cluster refused the validation or could not be asked.
    """
    console = tables.console()
    api = clients.api_client(kubeconfig, context)
    looked = timeout if wait else min(FIRST_LOOK, timeout)
    # Refreshed in place on a terminal; elsewhere (a log, a pipe) the table
    # is printed once, as found at the end.
    live = wait and console.is_terminal
    created = _Created()
    try:
        found = asyncio.run(
            _run(
                api, kernel, push=push, live=live, timeout=looked, console=console, created=created
            )
        )
    except (errors.KubeError, KeyboardInterrupt) as err:
        if isinstance(err, errors.Invalid) and created.name is None:
            # The apiserver's own words name the field (spec.kernelVersion ...).
            typer.echo(
                f"error: the cluster refused the PreflightValidation: {err.message}", err=True
            )
        elif isinstance(err, errors.KubeError):
            typer.echo(f"error: {err}", err=True)
        if created.name is not None:
            typer.echo(_left_in_place(created.name), err=True)
        raise typer.Exit(ERROR if isinstance(err, errors.KubeError) else 130) from None
    if not live:
        console.print(table(found))
    for line in outcome_lines(found, waited=wait, timeout=looked):
        console.print(line, highlight=False, markup=False)
    raise typer.Exit(exit_code(found, waited=wait))


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight_command)
