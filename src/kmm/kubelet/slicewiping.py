"""A node's ResourceSlices wiped, at start and when a driver stays away.

The kubelet deletes the node's slices when it starts (``wipe()``), and a
driver's slices ``wipe_delay`` after none of its plugins is usable any
more: deregistered, or its connection lost (a driver killed leaves its
socket behind), unless one is usable again by then (the kubelet's
``defaultWipingDelay``). How each absence ended, ``wiped`` or ``returned``,
is counted in the emulator's metrics (``metrics``); a restart's or a stop's
cancellation ends none.

The plugin registry (``registration``) tells ``plugins_changed`` of every
change; the emulator (``emulator``) owns the wiper and cancels its pending
wipes on restart and stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kmm.kube import client, errors, resources
from kmm.kubelet import metrics, registration

__all__ = ["SliceWiper"]

_log = logging.getLogger(__name__)

# How a driver's absence ended when it came back in time: the outcome label,
# and the cancellation message of its pending wipe.
_RETURNED = "returned"


class SliceWiper:
    """The node's slices wiped, now or after a driver's absence."""

    def __init__(
        self,
        api: client.Client,
        *,
        node: str,
        registry: registration.Registry,
        counts: metrics.Metrics,
        delay: float,
        on_change: Callable[[], None],
    ) -> None:
        self._api = api
        self._node = node
        self._registry = registry
        self._metrics = counts
        self._delay = delay
        # Told of every change of a driver's plugins (pods may wait for one).
        self._on_change = on_change
        self._wipes: dict[str, asyncio.Task[None]] = {}

    async def wipe(self, driver: str | None = None) -> None:
        """Delete the node's slices (of ``driver`` only, when given)."""
        selector = f"spec.nodeName={self._node}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        try:
            await self._api.request(
                "DELETE", resources.RESOURCE_SLICES.path(), query={"fieldSelector": selector}
            )
        except errors.ApiError as err:
            _log.warning("wiping ResourceSlices (%s) failed: %s", selector, err)

    def plugins_changed(self, driver: str) -> None:
        """The registry's listener: a wipe scheduled or cancelled for ``driver``."""
        pending = self._wipes.pop(driver, None)
        usable = self._registry.usable(driver)
        if pending is not None:
            # Why travels with the cancellation: the wipe itself records how
            # the absence ended, so a wipe that is not cancelled cannot be
            # counted as a return.
            pending.cancel(_RETURNED if usable else None)
        if not usable:
            self._wipes[driver] = asyncio.get_running_loop().create_task(self._wipe_later(driver))
        self._on_change()

    def pending(self) -> list[asyncio.Task[None]]:
        """The wipes waiting for their delay."""
        return list(self._wipes.values())

    def cancel(self) -> None:
        """Cancel every pending wipe; none counts as an absence ended."""
        for pending in self._wipes.values():
            pending.cancel()
        self._wipes.clear()

    async def _wipe_later(self, driver: str) -> None:
        try:
            await asyncio.sleep(self._delay)
            if not self._registry.usable(driver):
                _log.info("driver %s gone for %.0f s: wiping its slices", driver, self._delay)
                await self.wipe(driver)
                self._absence_ended(driver, "wiped")
            else:
                self._absence_ended(driver, _RETURNED)
        except asyncio.CancelledError as cancelled:
            # Back in time (or during the wipe); a restart's or a stop's
            # cancellation ends no absence.
            if cancelled.args == (_RETURNED,):
                self._absence_ended(driver, _RETURNED)
            raise
        self._wipes.pop(driver, None)

    def _absence_ended(self, driver: str, outcome: str) -> None:
        self._metrics.driver_absences.labels(driver, outcome).inc()
