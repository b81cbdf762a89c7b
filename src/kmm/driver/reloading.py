"""Following ``kmm driver --config FILE`` while the driver runs.

``Reloader`` looks at the file every ``interval`` seconds (its size and
modification time; a ConfigMap volume replaces the file through a symlink
swap, which changes both) and, when it changed, reads it again and hands the
resulting configuration to ``apply`` (the driver's ``reconfigure``, which
refuses what needs a restart). A file that no longer parses is reported and
the running configuration kept; a file that disappears is waited for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from kmm.driver import config as configuration

__all__ = ["Reloader"]

logger = logging.getLogger(__name__)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


class Reloader:
    def __init__(
        self,
        path: Path,
        make: Callable[[configuration.FileSettings], configuration.Config],
        apply: Callable[[configuration.Config], bool],
        *,
        interval: float = 2.0,
    ) -> None:
        self.path, self.make, self.apply, self.interval = path, make, apply, interval
        self._seen = _stamp(path)

    def check(self) -> bool | None:
        """One look; whether a change was applied (None: nothing changed)."""
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._seen:
            return None
        self._seen = stamp
        try:
            settings = configuration.load_file(self.path)
        except configuration.ConfigError as err:
            logger.error("settings not reloaded, keeping the running ones: %s", err)
            return False
        logger.info("settings file %s changed", self.path)
        return self.apply(self.make(settings))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
