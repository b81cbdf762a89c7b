"""What a registry request can end in, one type per outcome a caller decides on.

- ``CredentialsRequired``: the registry asked for credentials and none were given.
- ``CredentialsRejected``: the credentials given were refused (at the
  registry's Basic challenge or at the token endpoint): never a missing image.
- ``NotFound``: 404 (``MANIFEST_UNKNOWN``, ``BLOB_UNKNOWN``, ``NAME_UNKNOWN``).
- ``ScopeDenied``: 401/403 after a token *was* granted (``insufficient_scope``,
  ``DENIED``): how Docker Hub and GHCR answer for a repository that does not
  exist, and what a read-only credential gets on push.
- ``UnexpectedResponse``: any other status (a redirect loop included);
  ``Unreachable``: no HTTP answer (connection refused, TLS verification
  failed, timeout).
- ``DestinationRefused``: not dialled at all: the address is loopback,
  link-local or otherwise refused (``destinations``), or a Bearer realm or
  redirect would go to plain HTTP from a registry that is not insecure.

``AuthenticationError`` is the base of the first two. ``first_error`` reads
a registry's error body; ``public_status`` is the status as public texts
show it.

Two texts per error. ``public`` is what a Module's author may read (a
condition, an Event, a preflight verdict): the request, the host as the
image names it, the class of failure and the HTTP status, and a
distribution error code only when it is one the spec defines. It never
holds a response body, a socket error's text or an address a name resolved
to: a Module naming a host would otherwise read back what the operator's
network answers (a probe of it). ``str()`` adds ``detail`` (those texts),
for the operator's log and the CLI, whose user dialled the registry
themselves.
"""

from __future__ import annotations

import json
from typing import Final

__all__ = [
    "SPEC_CODES",
    "AuthenticationError",
    "CredentialsRejected",
    "CredentialsRequired",
    "DestinationRefused",
    "NotFound",
    "RegistryError",
    "ScopeDenied",
    "UnexpectedResponse",
    "Unreachable",
    "first_error",
    "public_code",
    "public_status",
]

#: The error codes of the distribution spec: a fixed vocabulary, safe to show
#: (a code outside it is text a server chose, and is left out).
SPEC_CODES: Final = frozenset(
    {
        "BLOB_UNKNOWN",
        "BLOB_UPLOAD_INVALID",
        "BLOB_UPLOAD_UNKNOWN",
        "DIGEST_INVALID",
        "MANIFEST_BLOB_UNKNOWN",
        "MANIFEST_INVALID",
        "MANIFEST_UNKNOWN",
        "NAME_INVALID",
        "NAME_UNKNOWN",
        "SIZE_INVALID",
        "UNAUTHORIZED",
        "DENIED",
        "UNSUPPORTED",
        "TOOMANYREQUESTS",
    }
)


def public_code(code: str) -> str:
    """``code`` if it is one of the spec's, else ""."""
    return code if code in SPEC_CODES else ""


def public_status(status: int, code: str) -> str:
    """``status`` and, when it is one of the spec's, ``code``: "404 MANIFEST_UNKNOWN"."""
    shown = public_code(code)
    return f"{status} {shown}" if shown else str(status)


def first_error(body: bytes) -> tuple[str, str]:
    """The first ``errors[].code`` and message of a distribution error body
    (for logs: the public text keeps only a code of the spec's)."""
    try:
        found = json.loads(body)["errors"][0]
        return str(found.get("code", "")), str(found.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return "", body[:200].decode(errors="replace")


class RegistryError(Exception):
    """A registry request that did not succeed.

    ``public``: the text a tenant may read; ``detail``: what else is known
    (a body's message, a socket error), for logs; ``status``: the HTTP
    status, 0 when there was no answer."""

    def __init__(self, public: str, *, detail: str = "", status: int = 0, code: str = "") -> None:
        super().__init__(f"{public} ({detail})" if detail else public)
        self.public = public
        self.detail = detail
        self.status = status
        self.code = code


class AuthenticationError(RegistryError):
    """The registry does not accept who we are (or that we are nobody)."""


class CredentialsRequired(AuthenticationError):
    """The registry asked for credentials and none were configured for its host."""


class CredentialsRejected(AuthenticationError):
    """The registry (or its token endpoint) refused the credentials given."""


class NotFound(RegistryError):
    """404: the manifest, blob or repository does not exist."""


class ScopeDenied(RegistryError):
    """401/403 with a granted token: the token does not cover the repository
    (a repository that does not exist, or an action the credential lacks)."""


class UnexpectedResponse(RegistryError):
    """Any other status; ``status`` and the registry's first error ``code``."""


class Unreachable(RegistryError):
    """No HTTP answer: connection refused, TLS verification failed, timeout."""


class DestinationRefused(RegistryError):
    """A destination the client does not dial (``destinations``), or a realm
    or redirect to plain HTTP from a registry that is not insecure."""
