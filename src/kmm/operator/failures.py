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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from kmm.kube import errors

__all__ = ["MAX_MESSAGE", "StepFailed", "describe", "step", "transient"]

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
    return isinstance(error, errors.ApiError) and error.retriable


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
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1] + "…"
    return text


def _text(error: BaseException) -> str:
    # An API error's text says the request and status already; anything
    # else (a builder's bug) needs its type: KeyError('x') reads "'x'".
    if isinstance(error, errors.ApiError):
        return str(error)
    return f"{type(error).__name__}: {error}"
