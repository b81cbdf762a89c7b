"""What build, sign and preflight pods are called (pure).

The planners find a kernel's pods by these names, and the names are KMM's:
``<module>-build-<kernel>`` and ``<module>-sign-<kernel>`` (``pod_name``);
a preflight pod is ``<validation>-<module>-<digest>``
(``preflight_pod_name``). Each is a DNS name of at most 63 characters, so a
name that would not be one as it stands is cut and ends in a digest of what
it names: two kernels (or two validations' Modules) never share a pod. Pull
pods are named by ``pulling``; the pods themselves are rendered by ``pods``
and ``preflightpods``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from kmm.operator.build import podparts

__all__ = ["pod_name", "preflight_pod_name"]

_MAX_NAME: Final = 63


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


_UNSAFE_NAME = re.compile(r"[^a-z0-9.-]")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def pod_name(module: str, role: podparts.PodRole, kernel: str) -> str:
    """``<module>-<role>-<kernel>`` as a DNS name of at most 63 characters.

    The kernel keeps ``[a-z0-9.-]``; anything else becomes ``-``. When that
    changed the kernel (``6.12.57+deb13-amd64``: two kernels could then share
    a name) or the name is too long or invalid, the name is cut and ends in a
    digest of (module, role, kernel), so distinct kernels keep distinct pods.
    """
    safe = _UNSAFE_NAME.sub("-", kernel.lower())
    name = f"{module}-{role}-{safe}"
    if safe == kernel and len(name) <= _MAX_NAME and _DNS_SUBDOMAIN.match(name):
        return name
    digest = _digest("\x00".join((module, role, kernel)), 10)
    head = name[: _MAX_NAME - len(digest) - 1]
    # Each dot-separated part must end alphanumeric: cut back to one that does.
    head = re.sub(r"[^a-z0-9]+$", "", re.sub(r"[-.]{2,}", "-", head))
    return f"{head}-{digest}" if head else digest


def preflight_pod_name(validation: str, module: str) -> str:
    """``<validation>-<module>-<digest>`` as a DNS label of at most 63 characters.

    The digest of (validation, module) is always there: the joined text alone
    is ambiguous (``a`` + ``b-c`` and ``a-b`` + ``c`` both read ``a-b-c``, and
    two validations' pods for Modules of one namespace would then fight over
    one name). Dots become ``-`` and the text is cut to leave room for it.
    """
    digest = _digest("\x00".join((validation, module)), 10)
    name = f"{validation}-{module}"
    head = re.sub(r"[^a-z0-9-]", "-", name.lower())[: _MAX_NAME - len(digest) - 1]
    head = re.sub(r"-{2,}", "-", head).strip("-")
    return f"{head}-{digest}" if head else digest
