"""Naming what failed in a Module's reconcile, and telling which failures it shows.

A reconcile plans (pure builders) and then sends (API writes). An exception
in either ends the reconcile and the controller retries the key with its
per-key backoff (``runtime.controllers.decide``). Before it goes, the
reconciler makes it visible on the Module: a Degraded condition
(``ReconcileFailed``) and a Warning Event, so that a failure that keeps
coming back is not a loop seen only in the operator's log.

``step`` tags an exception with what was being done ("applying DaemonSet
x", "planning the module loader"): ``StepFailed``, whose ``describe`` is
the message the Module shows, bounded in length. ``transient`` tells the
failures a Module does not show: a conflict (someone wrote first), a
throttled or unavailable API server, a fenced write (no longer the
leader). They pass by themselves, or are not the Module's; they are
retried unwrapped and unchanged.

``refused`` tells a write the API server answered with a refusal of that
one object: invalid (400, 422), forbidden (403: an admission policy, a
quota, Pod Security, a namespace being deleted), or its own error about it
(500: a server-side apply that cannot merge the object's lists, a webhook
that failed). Such a write does not end the reconcile: the reconciler
records it on what it concerns (``refusal`` is its text) and goes on with
the rest (one refusal stays local). Unlike the transient failures an
answered 500 is shown: retried alone it comes back the same. ``Told``
remembers which refusal each object's Warning Event told, so a refusal
repeated on every retry is told once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from kmm.kube import errors

__all__ = [
    "MAX_MESSAGE",
    "StepFailed",
    "Told",
    "describe",
    "refusal",
    "refused",
    "step",
    "transient",
]

# Long enough for an API server's refusal naming its fields, short enough for
# a condition a user reads (an Event keeps 1024 characters).
MAX_MESSAGE: Final = 512


class StepFailed(Exception):
    """``cause`` raised while the reconcile was ``doing`` something."""

    def __init__(self, doing: str, cause: Exception) -> None:
        super().__init__(f"{doing}: {_text(cause)}")
        self.doing = doing
        self.cause = cause


def transient(error: BaseException) -> bool:
    """Whether ``error`` is retried without the Module showing it."""
    if isinstance(error, StepFailed):
        return transient(error.cause)
    if isinstance(error, errors.Fenced | errors.Conflict):
        return True
    return isinstance(error, errors.ApiError) and error.retriable and not refused(error)


class Told:
    """Per Module key, per object it concerns, the refusal last told."""

    def __init__(self) -> None:
        self._told: dict[str, dict[str, str]] = {}

    def news(self, key: str, what: str, message: str) -> bool:
        """Whether ``message`` about ``what`` is not the one told last (it is now)."""
        told = self._told.setdefault(key, {})
        if told.get(what) == message:
            return False
        told[what] = message
        return True

    def settled(self, key: str, what: str) -> None:
        """``what`` went through: a refusal of it again is news."""
        told = self._told.get(key)
        if told is not None:
            told.pop(what, None)
            if not told:
                del self._told[key]

    def forget(self, key: str) -> None:
        self._told.pop(key, None)

    def __len__(self) -> int:
        return sum(len(told) for told in self._told.values())


def refused(error: BaseException) -> bool:
    """Whether ``error`` is the API server refusing one write for the object
    it carried (or where it goes): the object's concern, not the reconcile's."""
    if isinstance(error, StepFailed):
        return refused(error.cause)
    if isinstance(error, errors.Invalid | errors.Forbidden):
        return True
    # 500 is the server answering; no answer (0), a gateway or an
    # unavailable server (502-504) stay transient.
    return isinstance(error, errors.Unavailable) and error.status == 500


def refusal(error: BaseException) -> str:
    """The server's words for a refused write: status, reason, message."""
    if isinstance(error, StepFailed):
        return refusal(error.cause)
    if not isinstance(error, errors.ApiError):
        return _text(error)
    reason = f" {error.reason}" if error.reason else ""
    return _bounded(f"{error.status}{reason}: {error.message}")


@contextlib.contextmanager
def step(doing: str) -> Iterator[None]:
    """Raise what the block raises as ``StepFailed(doing, ...)``; transient
    errors and a ``StepFailed`` from an inner step pass unchanged."""
    try:
        yield
    except StepFailed:
        raise
    except Exception as err:
        if transient(err):
            raise
        raise StepFailed(doing, err) from err


def describe(error: BaseException) -> str:
    """The message a Module shows for ``error``, at most ``MAX_MESSAGE`` long."""
    text = str(error) if isinstance(error, StepFailed) else f"reconciling: {_text(error)}"
    return _bounded(text)


def _bounded(text: str) -> str:
    return text[: MAX_MESSAGE - 1] + "…" if len(text) > MAX_MESSAGE else text


def _text(error: BaseException) -> str:
    # An API error's text says the request and status already; anything
    # else (a builder's bug) needs its type: KeyError('x') reads "'x'".
    if isinstance(error, errors.ApiError):
        return str(error)
    return f"{type(error).__name__}: {error}"
