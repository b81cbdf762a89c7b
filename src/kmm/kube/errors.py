"""What can go wrong talking to the API server, grouped by what the caller can do.

::

    KubeError                  anything this layer raises on purpose
    ├── ConfigError            no usable cluster access; says what was tried
    ├── Fenced                 not sent: the request's fence said no (a leader
    │                          past its lease deadline); do not retry it
    └── ApiError               a request failed: status, reason, message, method, path
        ├── NotFound           404: the object (or its namespace) does not exist
        ├── Conflict           409: someone wrote first, or it already exists
        ├── Gone               410: the resourceVersion or continue token is too old: relist
        ├── Invalid            400/422: the server refused the body; ``causes`` name fields
        ├── Denied             not allowed to ask
        │   ├── Unauthorized   401: credentials missing, wrong or expired
        │   └── Forbidden      403: RBAC or an admission policy said no
        ├── Throttled          429: too many requests; ``retry_after`` seconds
        └── Unavailable        5xx, refused or cut connections, timeouts,
                               unreadable answers: try again later

``retriable`` is True for ``Throttled`` and ``Unavailable`` only: the
request may succeed unchanged. Callers branch on the class, never on text;
``from_response`` is the one place a status becomes a class.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "ApiError",
    "Cause",
    "ConfigError",
    "Conflict",
    "Denied",
    "Fenced",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "NotFound",
    "Throttled",
    "Unauthorized",
    "Unavailable",
    "from_response",
]


class KubeError(Exception):
    """Base of every error this layer raises on purpose."""


class ConfigError(KubeError):
    """No cluster access could be configured; the message lists what was tried."""


class Fenced(KubeError):
    """A request its ``fence`` refused, before (or between) attempts: nothing was sent.

    The operator's writes carry its leader elector's fence, so a replica
    whose lease may have run out sends nothing more, even a retry."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: not sent, fenced off (no longer the leader)")
        self.method = method
        self.path = path


@dataclasses.dataclass(frozen=True)
class Cause:
    """One field the server refused (``details.causes[]`` of a Status)."""

    field: str
    reason: str
    message: str


class ApiError(KubeError):
    """A request the API server refused, or that did not get an answer (status 0)."""

    retriable: ClassVar[bool] = False

    def __init__(
        self,
        status: int,
        message: str,
        *,
        reason: str = "",
        method: str = "",
        path: str = "",
        causes: tuple[Cause, ...] = (),
    ) -> None:
        where = f"{method} {path}: " if method or path else ""
        super().__init__(f"{where}{status} {reason + ': ' if reason else ''}{message}".strip())
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        self.causes = causes


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: a stale resourceVersion, or (``already_exists``) a create of an existing name."""

    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    """410: the resourceVersion (or continue token) expired; list again."""


class Invalid(ApiError):
    """400 or 422: the request or its body is wrong; retrying it unchanged fails again."""


class Denied(ApiError):
    """401 or 403."""


class Unauthorized(Denied):
    """401."""


class Forbidden(Denied):
    """403."""


class Throttled(ApiError):
    """429: the server asks to slow down; ``retry_after`` is its Retry-After, in seconds."""

    retriable = True

    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class Unavailable(ApiError):
    """5xx, or no answer at all (status 0): the server or the network may recover."""

    retriable = True


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Throttled,
}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from the API server; the caller's backoff decides


def from_response(
    status: int,
    body: bytes | str | Mapping[str, Any],
    *,
    method: str = "",
    path: str = "",
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The error for a non-2xx answer; ``body`` is a ``Status`` object when the server wrote one.

    Also used for a watch's ERROR event, whose object is a ``Status``.
    """
    status_object: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        status_object = body
    else:
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {}
        if isinstance(parsed, Mapping):
            status_object = parsed
    # A watch's ERROR object is a Status; some servers leave its kind out.
    if status_object.get("kind") == "Status" or "code" in status_object:
        message = str(status_object.get("message") or "")
        reason = str(status_object.get("reason") or "")
        code = status_object.get("code")
        if isinstance(code, int) and code:
            status = code
    else:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        message, reason = text.strip()[:500], ""
    details = status_object.get("details") or {}
    causes = tuple(
        Cause(str(c.get("field") or ""), str(c.get("reason") or ""), str(c.get("message") or ""))
        for c in (details.get("causes") or ())
        if isinstance(c, Mapping)
    )
    kind = _BY_STATUS.get(status, Unavailable if status >= 500 or status == 0 else ApiError)
    if kind is Throttled:
        return Throttled(
            status,
            message,
            reason=reason,
            method=method,
            path=path,
            causes=causes,
            retry_after=_retry_after(headers or {}),
        )
    return kind(status, message, reason=reason, method=method, path=path, causes=causes)
