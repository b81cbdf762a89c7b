"""The Events a Module's reconcile sends, and which refusals it has told.

``Teller.event`` sends an Event about the Module (``events.event``): a
DaemonSet, pod or DeviceClass created or deleted, a spec refused, a
reconcile that failed. ``Teller.node_event`` sends one about a Node
(``events.node_event``: the module loaded or unloaded there).
``Teller.tell`` sends a Warning Event for a write the API server refused,
unless that refusal is the one last told of the same object
(``failures.Told``): a refusal repeated on every retry is told once.
``settled`` marks an object whose write went through, so that a refusal of
it again is news; ``forget`` drops a Module's memory (it is gone).

Limits: it decides no Event; whether something happened that deserves one
is its caller's to say (``daemonsets``, ``imagepods``, ``deviceclasses``,
``labelling``, ``reconciler``). Every Event carries the reconcile's clock
(``now``) and the operator's ``instance``, and goes through
``writing.Writer.create_event``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from kmm.operator import events, failures, writing

__all__ = ["Teller"]

RawObject = dict[str, Any]


class Teller:
    def __init__(self, writer: writing.Writer, *, now: Callable[[], str], instance: str) -> None:
        self.writer = writer
        self.now = now
        self.instance = instance
        # Per Module, the refusal each object's last Warning Event told.
        self.told = failures.Told()

    async def event(
        self, raw: RawObject, type_: Literal["Normal", "Warning"], reason: str, message: str
    ) -> None:
        """An Event about the Module ``raw``."""
        await self.writer.create_event(
            events.event(
                raw,
                type_=type_,
                reason=reason,
                message=message,
                now=self.now(),
                instance=self.instance,
            )
        )

    async def node_event(self, node: RawObject, *, reason: str, message: str) -> None:
        """An Event about ``node``."""
        await self.writer.create_event(
            events.node_event(
                node, reason=reason, message=message, now=self.now(), instance=self.instance
            )
        )

    async def tell(self, raw: RawObject, key: str, what: str, reason: str, message: str) -> None:
        """A Warning Event for a refusal of ``what``, unless it told this one last."""
        if self.told.news(key, what, message):
            await self.event(raw, "Warning", reason, message)

    def settled(self, key: str, what: str) -> None:
        """``what`` of the Module ``key`` went through: a refusal of it again is news."""
        self.told.settled(key, what)

    def forget(self, key: str) -> None:
        self.told.forget(key)
