"""Whether an image exists in its registry: facts remembered, checks run in
the background, never on a reconcile's path.

A ``Key`` is what decides the answer: the image, the registry TLS options
that govern the request, and whose credentials (the Module's
``imageRepoSecret``, by namespace/name). A ``Fact`` is one of:

- ``EXISTS``: a manifest GET answered 200 (after its redirects); the fact
  carries the manifest's ``digest`` and the image config's kmm labels
  (``labels``: what made the image, ``images``; None when not known: an
  index, or a node's verdict);
- ``MISSING``: 404, or 401/403 ``insufficient_scope`` after a token was
  granted (how Docker Hub and GHCR answer for a repository that does not
  exist);
- ``AUTH_FAILED``: the credentials were refused or required, or the Secret
  cannot be read as a ``.dockerconfigjson``: never a reason to build;
- ``ERROR``: anything else (no answer, a 5xx, an address not dialled), and
  a key with no answer yet (``pending``: shown as "Checking").

``Checker.fact`` never waits for a registry. It answers from memory; a key
it has no answer for is a pending ``ERROR`` fact, and a check starts in the
background (a task of the checker's ``kmm.aio.tasks.TaskSet``, at most
``concurrency`` at once, each bounded by ``budget`` seconds) whose answer is
remembered; the ``Waiter`` the caller gave is then requeued, so the
reconcile runs again and reads it. ``ask`` is the check itself
(``asking.Asker`` over the network; a table in tests).

Facts are kept until someone says the answer may have changed (``forget``:
an image name changed, ``imageRebuildTriggerGeneration`` moved, a build or
sign pod of the image succeeded), so a converged Module costs no registry
request; a check in flight when its image is forgotten is cancelled and its
answer never kept (it could be older than what ``forget`` announced). What
is asked again on its own: ``ERROR`` and an anonymous ``AUTH_FAILED`` (the
registry wants credentials, the Module gives none: they may be made public)
after an exponential back-off (``retry_at``); a fact older than the
caller's ``max_age`` (an ``unsignedImage`` someone else pushes); an
``AUTH_FAILED`` judged with a Secret, once that Secret's resourceVersion
changed (a GET of the Secret in the background; no registry request while
it is the same). While such a fact is asked again it is still shown, marked
``pending``. The memory starts empty, so a restarted operator asks once.

``undecided`` marks a fact the operator cannot decide from where it stands
(``asking``): a node may still be able to pull the image. A node's verdict
(``pulling``: a pull pod's outcome) is kept with ``record``; it names the
``node`` and is remembered as a registry's answer is (an ``AUTH_FAILED``
one asked again after the back-off, by the registry first, then a node).

``remove`` deletes an image kmm pushed (a build's intermediate image once
signed) in the background too, with the same bound on concurrency and
time; its ``Deletion`` is kept until ``removal`` takes it, and a deleted
image's fact becomes ``MISSING``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

from kmm.aio import backoff, tasks
from kmm.api import buildsign

__all__ = [
    "Ask",
    "Checker",
    "Delete",
    "Deletion",
    "Fact",
    "Key",
    "SecretReader",
    "State",
    "Tls",
    "Waiter",
    "secret_version",
]

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]

#: GET of a Secret: the raw object, or None when it does not exist.
SecretReader = Callable[[str, str], Awaitable[RawObject | None]]

CHECKING = "checking the registry"


class State(enum.StrEnum):
    EXISTS = "Exists"
    MISSING = "Missing"
    AUTH_FAILED = "AuthenticationFailed"
    ERROR = "Error"


@dataclasses.dataclass(frozen=True)
class Tls:
    """The ``registryTLS`` options that change a request."""

    insecure: bool = False
    skip_verify: bool = False

    @classmethod
    def of(cls, options: buildsign.RegistryTLS | None) -> Tls:
        if options is None:
            return cls()
        return cls(bool(options.insecure), bool(options.insecure_skip_tls_verify))


@dataclasses.dataclass(frozen=True)
class Key:
    image: str
    tls: Tls = Tls()
    # ``<namespace>/<name>`` of the imageRepoSecret; "" for anonymous requests.
    secret: str = ""


@dataclasses.dataclass(frozen=True)
class Fact:
    state: State
    # What a Module's author may read: never a response body or socket error.
    message: str = ""
    # AUTH_FAILED: the Secret's resourceVersion it was judged with.
    secret_version: str = ""
    # When (``clock``) to ask again; 0: only once forgotten (or its Secret changed).
    retry_at: float = 0.0
    # No answer yet (an ERROR fact), or this one is being asked again.
    pending: bool = False
    # The operator cannot decide from here (no answer, an address it does
    # not dial, credentials required and none given): a node may.
    undecided: bool = False
    # The class of failure (``kmm.oci.errors`` type name, "InvalidReference",
    # "InvalidSecret", "Timeout") and its HTTP status (0: none).
    failure: str = ""
    status: int = 0
    # When (``clock``) the registry answered.
    checked_at: float = 0.0
    # EXISTS: the manifest's digest ("" when not known: a node's verdict).
    digest: str = ""
    # EXISTS: the image config's kmm labels (``kmm.api.labels.IMAGE_LABELS``);
    # None when not known (an index, a node's verdict), {} when it has none.
    labels: Mapping[str, str] | None = None
    # The node whose pull pod judged it ("": a registry answered).
    node: str = ""


def secret_version(secret: RawObject | None) -> str:
    """The resourceVersion an ``AUTH_FAILED`` fact records of its Secret."""
    if secret is None:
        return "absent"
    return str((secret.get("metadata") or {}).get("resourceVersion") or "")


class Ask(Protocol):
    """One check: whether ``key.image`` exists, given the imageRepoSecret
    as read (None: the key names none, or it does not exist)."""

    async def __call__(self, key: Key, secret: RawObject | None, /) -> Fact: ...


@dataclasses.dataclass(frozen=True)
class Deletion:
    """How a delete ended: ``deleted`` (or already gone), ``refused`` (the
    registry or the credentials do not allow it: 405, ``UNSUPPORTED``,
    401/403) or ``failed`` (no answer, anything else); ``message`` is
    public text."""

    outcome: Literal["deleted", "refused", "failed"]
    message: str = ""


class Delete(Protocol):
    """One delete: the manifest ``digest`` in ``key.image``'s repository."""

    async def __call__(self, key: Key, secret: RawObject | None, digest: str, /) -> Deletion: ...


@dataclasses.dataclass(frozen=True)
class Waiter:
    """Told (``enqueue(key)``) when the answer it waits for lands."""

    enqueue: Callable[[str], None]
    key: str


class Checker:
    """Existence facts per ``Key``; a ``runtime.manager`` runnable whose
    ``run`` cancels the checks in flight when it stops."""

    name = "registry-checks"

    def __init__(
        self,
        ask: Ask,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_initial: float = 2.0,
        retry_maximum: float = 120.0,
        concurrency: int = 4,
        budget: float = 30.0,
        delete: Delete | None = None,
    ) -> None:
        self._ask = ask
        self._delete = delete
        self._removals: dict[Key, Deletion] = {}
        self._clock = clock
        self._retry = (retry_initial, retry_maximum)
        self._budget = budget
        self._slots = asyncio.Semaphore(concurrency)
        self._facts: dict[Key, Fact] = {}
        self._backoffs: dict[Key, backoff.Backoff] = {}
        # The check whose answer is kept, per key: the task itself is its
        # generation (a forgotten key's check is no longer listed).
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._waiters: dict[Key, set[Waiter]] = {}
        self._rechecks: dict[Key, float] = {}
        self._tasks = tasks.TaskSet("registry-checks")
        self._closed = False
        self.checks: collections.Counter[str] = collections.Counter()

    def known(self, key: Key) -> Fact | None:
        """The remembered fact, without asking anyone."""
        return self._facts.get(key)

    def running(self) -> int:
        """Checks in flight (started and not yet answered or cancelled)."""
        return len(self._running)

    def forget(self, image: str) -> None:
        """Every fact about ``image`` (any TLS, any credentials): ask again.
        A check of it in flight is cancelled: its answer may predate the change."""
        for key in [k for k in self._facts if k.image == image]:
            del self._facts[key]
            self._backoffs.pop(key, None)
        for key in [k for k in self._running if k.image == image]:
            self._running.pop(key).cancel()

    def record(self, key: Key, verdict: Fact) -> None:
        """Keep ``verdict``, a node's answer for ``key`` (a pull pod's), as
        if the registry had given it; a check of ``key`` in flight is
        cancelled (the node's answer is the newer one) and its waiters are
        requeued."""
        running = self._running.pop(key, None)
        if running is not None:
            running.cancel()
        self._facts[key] = self._scheduled(key, verdict)
        self.checks[verdict.state.value] += 1
        for waiter in sorted(self._waiters.pop(key, set()), key=lambda w: w.key):
            waiter.enqueue(waiter.key)

    def _due(self, key: Key, found: Fact, now: float) -> bool:
        if found.retry_at:
            return now >= found.retry_at
        recheck = self._rechecks.get(key)
        return (
            found.state is State.MISSING
            and recheck is not None
            and now >= found.checked_at + recheck
        )

    def fact(
        self,
        key: Key,
        read_secret: SecretReader,
        *,
        waiter: Waiter | None = None,
        recheck_missing: float | None = None,
    ) -> Fact:
        """The remembered fact, at once. A check starts in the background
        when there is none (a pending ``ERROR`` fact is returned then), when
        it is due (``retry_at`` passed), or, for an ``AUTH_FAILED`` fact
        judged with a Secret, in case the Secret changed; ``waiter`` is
        told when its answer lands. ``recheck_missing``: a ``MISSING``
        answer for ``key`` is asked again after that many seconds (an
        image someone else pushes)."""
        now = self._clock()
        if recheck_missing is not None:
            self._rechecks[key] = recheck_missing
        found = self._facts.get(key)
        if key not in self._running:
            if found is None or self._due(key, found, now):
                self._start(key, read_secret, probe=False)
            elif found.state is State.AUTH_FAILED and key.secret and not found.node:
                self._start(key, read_secret, probe=True)
            else:
                return found
        if waiter is not None:
            self._waiters.setdefault(key, set()).add(waiter)
        # The waiter is requeued when the answer lands; this retry_at is a
        # safety net that never spins.
        shown_retry = now + self._budget
        if found is None:
            return Fact(State.ERROR, CHECKING, pending=True, retry_at=shown_retry)
        return dataclasses.replace(
            found, pending=True, retry_at=shown_retry if found.retry_at else 0.0
        )

    def _start(self, key: Key, read_secret: SecretReader, *, probe: bool) -> None:
        if self._closed:
            return  # stopping: a reconcile still finishing starts nothing that outlives it
        self._running[key] = self._tasks.spawn(
            self._check(key, read_secret, probe=probe), name=f"check/{key.image}"
        )

    async def _check(self, key: Key, read_secret: SecretReader, *, probe: bool) -> None:
        try:
            answer = await self._answer(key, read_secret, probe=probe)
        except Exception:
            _log.exception("registry check of %s failed", key.image)
            answer = Fact(State.ERROR, f"{key.image}: the check failed", failure="CheckFailed")
        if self._running.get(key) is not asyncio.current_task():
            return  # forgotten meanwhile: a newer check decides
        del self._running[key]
        waiters = self._waiters.pop(key, set())
        if answer is None:
            return  # the Secret is as it was: the fact stands
        self._facts[key] = self._scheduled(key, answer)
        self.checks[answer.state.value] += 1
        for waiter in sorted(waiters, key=lambda w: w.key):
            waiter.enqueue(waiter.key)

    async def _answer(self, key: Key, read_secret: SecretReader, *, probe: bool) -> Fact | None:
        """The registry's answer; None when ``probe`` found the Secret unchanged."""
        secret = None
        if key.secret:
            namespace, _, name = key.secret.partition("/")
            secret = await read_secret(namespace, name)
            before = self._facts.get(key)
            if probe and before is not None and secret_version(secret) == before.secret_version:
                return None
        async with self._slots:
            try:
                async with asyncio.timeout(self._budget):
                    return await self._ask(key, secret)
            except TimeoutError:
                return Fact(
                    State.ERROR,
                    f"{key.image}: the registry did not answer within {self._budget:g} s",
                    undecided=True,
                    failure="Timeout",
                )

    def _scheduled(self, key: Key, answer: Fact) -> Fact:
        """``answer`` stamped with when it came and when to ask again."""
        now = self._clock()
        answered = dataclasses.replace(answer, checked_at=now, retry_at=0.0, pending=False)
        recheck = self._rechecks.get(key)
        if answer.state is State.MISSING and recheck is not None:
            self._backoffs.pop(key, None)
            return dataclasses.replace(answered, retry_at=now + recheck)
        if not (
            answer.state is State.ERROR
            or (answer.state is State.AUTH_FAILED and not (key.secret and not answer.node))
        ):
            self._backoffs.pop(key, None)
            return answered
        delay = self._backoffs.setdefault(
            key, backoff.Backoff(initial=self._retry[0], maximum=self._retry[1])
        )
        return dataclasses.replace(answered, retry_at=now + delay.next())

    def remove(
        self, key: Key, digest: str, read_secret: SecretReader, *, waiter: Waiter | None = None
    ) -> bool:
        """Delete ``digest`` of ``key.image``'s repository in the background;
        ``waiter`` is told when it ended (``removal``). False when there is
        no deleter, or the checker is stopping."""
        if self._delete is None or self._closed:
            return False
        self._tasks.spawn(
            self._remove(key, digest, read_secret, waiter), name=f"delete/{key.image}"
        )
        return True

    def removal(self, key: Key) -> Deletion | None:
        """How the last delete of ``key`` ended (once: it is forgotten then)."""
        return self._removals.pop(key, None)

    async def _remove(
        self, key: Key, digest: str, read_secret: SecretReader, waiter: Waiter | None
    ) -> None:
        assert self._delete is not None
        try:
            secret = None
            if key.secret:
                namespace, _, name = key.secret.partition("/")
                secret = await read_secret(namespace, name)
            async with self._slots:
                async with asyncio.timeout(self._budget):
                    done = await self._delete(key, secret, digest)
        except TimeoutError:
            done = Deletion(
                "failed", f"{key.image}: the registry did not answer within {self._budget:g} s"
            )
        except Exception:
            _log.exception("deleting %s@%s failed", key.image, digest)
            done = Deletion("failed", f"{key.image}: the delete failed")
        if done.outcome == "deleted":
            self.forget(key.image)
            self._facts[key] = Fact(
                State.MISSING, f"{key.image} was deleted", checked_at=self._clock()
            )
        self._removals[key] = done
        if waiter is not None:
            waiter.enqueue(waiter.key)

    async def settled(self) -> None:
        """Wait until every check task has ended, cancelled ones included
        (tests; a drained operator)."""
        while pending := self._tasks.tasks():
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Cancel the checks in flight; start none after."""
        self._closed = True
        self._running.clear()
        await self._tasks.close()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await stop.wait()
        finally:
            await self.close()
