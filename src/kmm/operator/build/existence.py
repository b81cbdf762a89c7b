"""Whether an image exists in its registry, asked over the OCI distribution
API (``kmm.oci.client``) and remembered.

A ``Key`` is what decides the answer: the image, the registry TLS options
that govern the request, and whose credentials (the Module's
``imageRepoSecret``, by namespace/name). A ``Fact`` is one of:

- ``EXISTS``: a manifest HEAD answered 200;
- ``MISSING``: 404, or 401/403 ``insufficient_scope`` after a token was
  granted (how Docker Hub and GHCR answer for a repository that does not
  exist; ``Client.exists`` maps both);
- ``AUTH_FAILED``: the credentials were refused or required, or the Secret
  cannot be read as a ``.dockerconfigjson``: never a reason to build;
- ``ERROR``: anything else (no answer, a 5xx); asked again after an
  exponential back-off (``due``).

Facts are kept until someone says the answer may have changed (``forget``:
an image name changed, ``imageRebuildTriggerGeneration`` moved, a build or
sign pod of the image succeeded) and are never refreshed on their own: a
converged Module costs no registry request. The memory starts empty, so a
restarted operator asks once. An ``AUTH_FAILED`` fact records the
resourceVersion of the Secret it was judged with; ``fact`` asks again when
the Secret changed (a GET of the Secret, no registry request otherwise).

Registry TLS: ``insecure`` allows plain HTTP, tried after HTTPS fails to
answer (go-containerregistry's order), and verifies no certificate (as the
build and sign pods' ``--tls-verify=false``); ``insecureSkipTLSVerify``
verifies no certificate. The operator's ``--registry-ca`` files are trusted beside
the system's roots, and ``endpoints`` (``--registry-endpoint HOST=ENDPOINT``)
dial another address for a host while the TLS server name stays the host's.

``requests`` counts every HTTP request sent (``kmm_registry_requests_total``)
and ``checks`` the checks by outcome, so a test can show a converged Module
makes none.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kmm.aio import backoff
from kmm.api import modules
from kmm.oci import auth, client, errors, references

__all__ = ["Checker", "Fact", "Key", "SecretReader", "State", "Tls", "parse_endpoints"]

RawObject = dict[str, Any]

#: GET of a Secret: the raw object, or None when it does not exist.
SecretReader = Callable[[str, str], Awaitable[RawObject | None]]

_DOCKERCONFIG = ".dockerconfigjson"


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
    def of(cls, options: modules.RegistryTLS | None) -> Tls:
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
    message: str = ""
    # AUTH_FAILED: the Secret's resourceVersion it was judged with.
    secret_version: str = ""
    # ERROR: when (``clock``) to ask again.
    retry_at: float = 0.0


def parse_endpoints(pairs: Sequence[str]) -> dict[str, str]:
    """``HOST=ENDPOINT`` flags as a mapping; ValueError naming a malformed one."""
    found: dict[str, str] = {}
    for pair in pairs:
        host, equals, endpoint = pair.partition("=")
        if not equals or not host.strip() or not endpoint.strip() or "/" in host + endpoint:
            raise ValueError(f"{pair!r} is not HOST=ENDPOINT (each host[:port], no scheme)")
        found[host.strip()] = endpoint.strip()
    return found


def _secret_version(secret: RawObject | None) -> str:
    if secret is None:
        return "absent"
    return str((secret.get("metadata") or {}).get("resourceVersion") or "")


def _credentials(secret: RawObject | None, key: Key, host: str) -> auth.Credentials | None:
    """The Secret's credentials for ``host``; ValueError naming what is wrong."""
    if secret is None:
        raise ValueError(f"imageRepoSecret {key.secret} does not exist")
    encoded = (secret.get("data") or {}).get(_DOCKERCONFIG)
    if not isinstance(encoded, str):
        raise ValueError(f"imageRepoSecret {key.secret} has no {_DOCKERCONFIG} key")
    try:
        document = base64.b64decode(encoded, validate=True)
    except binascii.Error as err:
        raise ValueError(f"imageRepoSecret {key.secret}: {_DOCKERCONFIG} is not base64") from err
    try:
        return auth.credentials_for(document, host)
    except ValueError as err:
        raise ValueError(f"imageRepoSecret {key.secret}: {err}") from err


class Checker:
    """Existence facts per ``Key``, asked of registries only when due."""

    def __init__(
        self,
        *,
        ca_files: Sequence[Path] = (),
        endpoints: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_initial: float = 2.0,
        retry_maximum: float = 120.0,
        timeout: float = 30.0,
    ) -> None:
        self._ca_files = tuple(ca_files)
        self._endpoints = dict(endpoints or {})
        self._clock = clock
        self._retry = (retry_initial, retry_maximum)
        self._timeout = timeout
        self._facts: dict[Key, Fact] = {}
        self._backoffs: dict[Key, backoff.Backoff] = {}
        self.requests = 0
        self.checks: collections.Counter[str] = collections.Counter()

    def known(self, key: Key) -> Fact | None:
        """The remembered fact, without asking anyone."""
        return self._facts.get(key)

    def forget(self, image: str) -> None:
        """Every fact about ``image`` (any TLS, any credentials): ask again."""
        for key in [k for k in self._facts if k.image == image]:
            del self._facts[key]
            self._backoffs.pop(key, None)

    def due(self, key: Key) -> bool:
        """Whether the registry is to be asked (not counting a changed Secret)."""
        found = self._facts.get(key)
        return found is None or (found.state is State.ERROR and self._clock() >= found.retry_at)

    async def fact(self, key: Key, read_secret: SecretReader) -> Fact:
        """The remembered fact, or the registry's answer when one is due; an
        ``AUTH_FAILED`` fact is asked again once its Secret changed."""
        found = self._facts.get(key)
        if found is not None and found.state is State.AUTH_FAILED and key.secret:
            namespace, _, name = key.secret.partition("/")
            secret = await read_secret(namespace, name)
            if _secret_version(secret) == found.secret_version:
                return found
            return await self._check(key, secret)
        if not self.due(key):
            assert found is not None
            return found
        secret = None
        if key.secret:
            namespace, _, name = key.secret.partition("/")
            secret = await read_secret(namespace, name)
        return await self._check(key, secret)

    async def _check(self, key: Key, secret: RawObject | None) -> Fact:
        found = await self._ask(key, secret)
        self.checks[found.state.value] += 1
        if found.state is State.ERROR:
            delay = self._backoffs.setdefault(
                key, backoff.Backoff(initial=self._retry[0], maximum=self._retry[1])
            )
            found = dataclasses.replace(found, retry_at=self._clock() + delay.next())
        else:
            self._backoffs.pop(key, None)
        self._facts[key] = found
        return found

    def _count(self) -> None:
        self.requests += 1

    async def _ask(self, key: Key, secret: RawObject | None) -> Fact:
        try:
            reference = references.parse(key.image)
        except ValueError as err:
            return Fact(State.ERROR, str(err))
        credentials = None
        if key.secret:
            try:
                credentials = _credentials(secret, key, reference.host)
            except ValueError as err:
                return Fact(State.AUTH_FAILED, str(err), secret_version=_secret_version(secret))
        # insecure: HTTPS first, plain HTTP when HTTPS gets no answer; and,
        # as the builder's --tls-verify=false and Docker's insecure
        # registries, a certificate nobody vouches for is accepted (else the
        # pod would push an image this check never sees).
        for plain in (False, True) if key.tls.insecure else (False,):
            registry = client.Client(
                reference.host,
                credentials=credentials,
                ca_files=self._ca_files,
                verify_tls=not (key.tls.skip_verify or key.tls.insecure),
                plain_http=plain,
                actions=("pull",),
                timeout=self._timeout,
                endpoint=self._endpoints.get(reference.host),
                on_request=self._count,
            )
            try:
                async with registry:
                    found = await registry.exists(reference.name, reference.reference)
            except errors.Unreachable as err:
                if key.tls.insecure and not plain:
                    continue
                return Fact(State.ERROR, str(err))
            except errors.AuthenticationError as err:
                who = f" with imageRepoSecret {key.secret}" if key.secret else ""
                return Fact(
                    State.AUTH_FAILED,
                    f"{key.image}{who}: {err}",
                    secret_version=_secret_version(secret),
                )
            except errors.RegistryError as err:
                return Fact(State.ERROR, f"{key.image}: {err}")
            if found is None:
                return Fact(State.MISSING, f"{key.image} does not exist")
            return Fact(State.EXISTS)
        raise AssertionError("unreachable")  # pragma: no cover
