"""Default locations, from the environment (read only here, in the CLI layer)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "sandbox_dir"]


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable)
    return Path(value) if value else Path.home() / fallback


def cache_dir() -> Path:
    """Where built binaries are cached: $KMM_CACHE_DIR, else $XDG_CACHE_HOME/kmm."""
    override = os.environ.get("KMM_CACHE_DIR")
    return Path(override) if override else _xdg("XDG_CACHE_HOME", ".cache") / "kmm"


def sandbox_dir() -> Path:
    """The default sandbox: $KMM_SANDBOX_DIR, else $XDG_STATE_HOME/kmm/sandbox."""
    override = os.environ.get("KMM_SANDBOX_DIR")
    return (
        Path(override) if override else _xdg("XDG_STATE_HOME", ".local/state") / "kmm" / "sandbox"
    )
