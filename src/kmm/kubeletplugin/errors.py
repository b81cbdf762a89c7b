"""Errors of the kubelet plugin library, grouped by what the caller can do.

::

    PluginError                      anything this library raises on purpose
    ├── RecoverableError             retried by the library itself; log it
    │   └── PublishError             a ResourceSlice write failed (retried)
    ├── FatalError                   the plugin cannot serve the kubelet any
    │                                more; the owner should shut down
    ├── ClaimError                   one claim failed; the others are answered
    │   ├── UnsafeClaimError         a UID/name that could become a path
    │   ├── NotAllowedError          claims refused until allow_claims()
    │   └── ClaimNotFoundError       the ResourceClaim is gone or was replaced
    ├── CDIError                     a CDI name is invalid or a spec unwritable
    └── CheckpointError              the checkpoint cannot be read or written
        └── CheckpointCorruptedError names the file and the problem; the
                                     file is never silently replaced

API requests raise ``kmm.kube.errors`` (one tree for all of kmm); the
library turns those it cannot heal into ``FatalError``.

``Plugin.handle_error`` logs a ``RecoverableError`` and turns anything else
into ``Owner.request_shutdown``.
"""

from __future__ import annotations

import pathlib

__all__ = [
    "CDIError",
    "CheckpointCorruptedError",
    "CheckpointError",
    "ClaimError",
    "ClaimNotFoundError",
    "FatalError",
    "NotAllowedError",
    "PluginError",
    "PublishError",
    "RecoverableError",
    "UnsafeClaimError",
]


class PluginError(Exception):
    """Base of every error this library raises on purpose."""


class RecoverableError(PluginError):
    """A background failure the library retries by itself."""


class PublishError(RecoverableError):
    """Writing ResourceSlices failed; the publisher retries with backoff."""


class FatalError(PluginError):
    """The plugin can no longer serve the kubelet; its owner should stop."""


class ClaimError(PluginError):
    """Preparing or unpreparing one claim failed; other claims are unaffected."""


class UnsafeClaimError(ClaimError):
    """A claim UID, name or namespace holds characters we refuse to use."""


class NotAllowedError(ClaimError):
    """Claims are refused until the owner calls ``allow_claims()``."""


class ClaimNotFoundError(ClaimError):
    """The ResourceClaim does not exist, or has another UID than requested."""


class CDIError(PluginError):
    """An invalid CDI vendor/class/device name, or a spec file problem."""


class CheckpointError(PluginError):
    """The checkpoint file cannot be read or written."""


class CheckpointCorruptedError(CheckpointError):
    """The checkpoint exists but cannot be trusted: it is kept for a human."""

    def __init__(self, path: pathlib.Path, problem: str) -> None:
        super().__init__(f"checkpoint {path} is corrupted: {problem}")
        self.path = path
        self.problem = problem
