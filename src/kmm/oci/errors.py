"""What a registry request can end in, one type per outcome a caller decides on.

- ``CredentialsRequired``: the registry asked for credentials and none were given.
- ``CredentialsRejected``: the credentials given were refused (at the
  registry's Basic challenge or at the token endpoint): never a missing image.
- ``NotFound``: 404 (``MANIFEST_UNKNOWN``, ``BLOB_UNKNOWN``, ``NAME_UNKNOWN``).
- ``ScopeDenied``: 401/403 after a token *was* granted (``insufficient_scope``,
  ``DENIED``): how Docker Hub and GHCR answer for a repository that does not
  exist, and what a read-only credential gets on push.
- ``UnexpectedResponse``: any other status; ``Unreachable``: no HTTP answer
  (connection refused, TLS verification failed, timeout).

``AuthenticationError`` is the base of the first two.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "CredentialsRejected",
    "CredentialsRequired",
    "NotFound",
    "RegistryError",
    "ScopeDenied",
    "UnexpectedResponse",
    "Unreachable",
]


class RegistryError(Exception):
    """A registry request that did not succeed; the message names the request."""


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

    def __init__(self, message: str, *, status: int, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Unreachable(RegistryError):
    """No HTTP answer: connection refused, TLS verification failed, timeout."""
