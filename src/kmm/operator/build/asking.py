"""One existence check of one image over the OCI distribution API
(``kmm.oci.client``), its outcome as an ``existence.Fact``; and the delete
of an intermediate image once it was signed.

A check reads the image (``kmm.oci.configs.inspect``: a manifest GET and,
for a single-platform image, its config blob): whether it exists, its
digest, and the labels kmm's builds put in its config
(``kmm.api.labels.IMAGE_LABELS``, the others dropped). Answers are read up
to ``MAX_BODY`` bytes: a registry a tenant names cannot make the operator
read without bound. That is two requests where a HEAD was one, for the
images a build concern asks about only, and once per fact: a converged
Module asks nothing (``existence``).

``delete`` removes a manifest by digest (``DELETE /v2/<name>/manifests/
<digest>``) with the Module's ``imageRepoSecret``, asking a token for the
``delete`` action: the one write the operator itself sends to a registry,
for an image kmm pushed (``build.cleanup``). A registry that does not
allow it (405, ``UNSUPPORTED``, credentials without the right) answers
``existence.Deletion`` ``refused``: nothing breaks, the image stays.

What the check dials is the image's host (or the operator's
``--registry-endpoint`` for it), its Bearer realm and the redirects it
answers with, each refused when loopback or link-local
(``kmm.oci.destinations``; the configured endpoints excepted). Every
request has a short timeout (``Settings.timeout``).

Registry TLS: ``insecure`` allows plain HTTP, tried after HTTPS fails to
answer (go-containerregistry's order), follows plain-HTTP realms and
redirects, and verifies no certificate (as the build and sign pods'
``--tls-verify=false``); ``insecureSkipTLSVerify`` verifies no certificate.

The fact's message is the error's ``public`` text (the class of failure and
the HTTP status, never a response body or a socket error: a Module's
author reads it); the detail goes to the operator's log. A failure the
operator cannot decide from where it stands (no answer, an address it does
not dial, credentials required and the Module gives none) is marked
``undecided``: a node, with its own network and credential providers, may
still pull the image. An image name that is not a reference comes back as
an ``ERROR`` fact, never as an exception.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from kmm.api import labels
from kmm.oci import auth, client, configs, destinations, errors, references
from kmm.operator.build import existence

__all__ = ["MAX_BODY", "Asker", "parse_endpoints"]

#: Bytes of one answer the checks read: manifests and image configs are a
#: few KiB (the distribution spec lets registries refuse manifests over 4 MiB).
MAX_BODY: Final = 1024 * 1024

_log = logging.getLogger(__name__)

RawObject = dict[str, Any]
_DOCKERCONFIG = ".dockerconfigjson"


def parse_endpoints(pairs: Sequence[str]) -> dict[str, str]:
    """``HOST=ENDPOINT`` flags as a mapping; ValueError naming a malformed one."""
    found: dict[str, str] = {}
    for pair in pairs:
        host, equals, endpoint = pair.partition("=")
        if not equals or not host.strip() or not endpoint.strip() or "/" in host + endpoint:
            raise ValueError(f"{pair!r} is not HOST=ENDPOINT (each host[:port], no scheme)")
        found[host.strip()] = endpoint.strip()
    return found


def _credentials(
    secret: RawObject | None, key: existence.Key, host: str
) -> auth.Credentials | None:
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


def _failed(
    key: existence.Key, state: existence.State, err: errors.RegistryError, **more: Any
) -> existence.Fact:
    _log.info("registry check of %s: %s", key.image, err)
    return existence.Fact(
        state,
        f"{key.image}: {err.public}",
        failure=type(err).__name__,
        status=err.status,
        **more,
    )


class Asker:
    """``existence.Ask`` over the network: extra CAs, the
    ``--registry-endpoint`` pairs (``parse_endpoints``) and the per-request
    timeout in seconds; ``requests`` counts every HTTP request sent
    (``kmm_registry_requests_total``)."""

    def __init__(
        self,
        *,
        ca_files: Sequence[Path] = (),
        endpoints: Mapping[str, str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.ca_files = tuple(ca_files)
        self.endpoints = dict(endpoints or {})
        self.timeout = timeout
        self.guard = destinations.Guard(destinations.trusted_pairs(self.endpoints.values()))
        self.requests = 0

    def _count(self) -> None:
        self.requests += 1

    async def __call__(self, key: existence.Key, secret: RawObject | None) -> existence.Fact:
        """Whether ``key.image`` exists (``secret``: the imageRepoSecret as
        read, None when the key names none or it does not exist)."""
        try:
            reference = references.parse(key.image)
            client.check_name(reference.name)
            client.check_reference(reference.reference)
        except ValueError as err:
            return existence.Fact(existence.State.ERROR, f"{err}", failure="InvalidReference")
        credentials = None
        if key.secret:
            try:
                credentials = _credentials(secret, key, reference.host)
            except ValueError as err:
                return existence.Fact(
                    existence.State.AUTH_FAILED,
                    str(err),
                    secret_version=existence.secret_version(secret),
                    failure="InvalidSecret",
                )
        return await self._inspect(key, reference, credentials, secret)

    def _client(
        self,
        key: existence.Key,
        reference: references.Reference,
        credentials: auth.Credentials | None,
        *,
        plain: bool,
        actions: tuple[str, ...],
    ) -> client.Client:
        return client.Client(
            reference.host,
            credentials=credentials,
            ca_files=self.ca_files,
            verify_tls=not (key.tls.skip_verify or key.tls.insecure),
            plain_http=plain,
            insecure=key.tls.insecure,
            actions=actions,
            timeout=self.timeout,
            endpoint=self.endpoints.get(reference.host),
            guard=self.guard,
            on_request=self._count,
            max_body=MAX_BODY,
        )

    async def _inspect(
        self,
        key: existence.Key,
        reference: references.Reference,
        credentials: auth.Credentials | None,
        secret: RawObject | None,
    ) -> existence.Fact:
        # insecure: HTTPS first, plain HTTP when HTTPS gets no answer; and,
        # as the builder's --tls-verify=false and Docker's insecure
        # registries, a certificate nobody vouches for is accepted (else the
        # pod would push an image this check never sees).
        for plain in (False, True) if key.tls.insecure else (False,):
            registry = self._client(key, reference, credentials, plain=plain, actions=("pull",))
            try:
                async with registry:
                    found = await configs.inspect(
                        registry, reference.name, reference.reference, keep=labels.PREFIX
                    )
            except errors.Unreachable as err:
                if key.tls.insecure and not plain:
                    continue
                return _failed(key, existence.State.ERROR, err, undecided=True)
            except errors.DestinationRefused as err:
                return _failed(key, existence.State.ERROR, err, undecided=True)
            except errors.AuthenticationError as err:
                who = f" with imageRepoSecret {key.secret}" if key.secret else ""
                found_fact = _failed(
                    key,
                    existence.State.AUTH_FAILED,
                    err,
                    secret_version=existence.secret_version(secret),
                    undecided=not key.secret and isinstance(err, errors.CredentialsRequired),
                )
                return dataclasses.replace(found_fact, message=f"{key.image}{who}: {err.public}")
            except errors.RegistryError as err:
                return _failed(key, existence.State.ERROR, err)
            if found is None:
                return existence.Fact(existence.State.MISSING, f"{key.image} does not exist")
            kept = None
            if found.labels is not None:
                kept = {k: v for k, v in found.labels.items() if k in labels.IMAGE_LABELS}
            return existence.Fact(existence.State.EXISTS, digest=found.digest, labels=kept)
        raise AssertionError("unreachable")  # pragma: no cover

    async def delete(
        self, key: existence.Key, secret: RawObject | None, digest: str
    ) -> existence.Deletion:
        """Delete the manifest ``digest`` of ``key.image``'s repository."""
        try:
            reference = references.parse(key.image)
            client.check_name(reference.name)
        except ValueError as err:
            return existence.Deletion("failed", str(err))
        credentials = None
        if key.secret:
            try:
                credentials = _credentials(secret, key, reference.host)
            except ValueError as err:
                return existence.Deletion("refused", str(err))
        for plain in (False, True) if key.tls.insecure else (False,):
            registry = self._client(
                key, reference, credentials, plain=plain, actions=("pull", "delete")
            )
            try:
                async with registry:
                    await registry.delete_manifest(reference.name, digest)
            except errors.Unreachable as err:
                if key.tls.insecure and not plain:
                    continue
                return _deletion("failed", err)
            except errors.NotFound:
                return existence.Deletion("deleted", f"{key.image}@{digest} was already gone")
            except (errors.AuthenticationError, errors.ScopeDenied) as err:
                return _deletion("refused", err)
            except errors.RegistryError as err:
                if err.status == 405 or err.code == "UNSUPPORTED":
                    return _deletion("refused", err)
                return _deletion("failed", err)
            except ValueError as err:  # not a sha256 digest
                return existence.Deletion("failed", str(err))
            return existence.Deletion("deleted")
        raise AssertionError("unreachable")  # pragma: no cover


def _deletion(
    outcome: Literal["deleted", "refused", "failed"], err: errors.RegistryError
) -> existence.Deletion:
    _log.info("delete: %s", err)
    return existence.Deletion(outcome, err.public)
