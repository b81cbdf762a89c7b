"""The node driver's configuration, and the rules for turning DRA on.

``dra.enabled`` is a tri-state (seed 001): ``None`` means "off unless the
policy asks for DRA", an explicit ``False`` always wins, ``True`` turns it
on. Without cluster access (no API client, so nothing to publish to) DRA
stays off with a warning instead of failing the start. Changing the switch
at runtime is refused with a message asking for a restart: both directions
would have to stop or start the plugin with the owner's lock released,
and reconfiguration holds it.
"""

from __future__ import annotations

import dataclasses
import pathlib

__all__ = ["Config", "ConfigError", "DRAConfig", "Decision", "check_reconfigure", "decide_dra"]


class ConfigError(Exception):
    """A configuration that cannot be applied (as given, or without a restart)."""


@dataclasses.dataclass(frozen=True)
class DRAConfig:
    enabled: bool | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything ``kmm driver`` was told; ``root`` prefixes every host path."""

    node: str
    driver_name: str
    module: str
    device_class: str | None = None
    dev_pattern: str | None = None
    root: pathlib.Path = pathlib.Path("/")
    dra: DRAConfig = DRAConfig()


@dataclasses.dataclass(frozen=True)
class Decision:
    enabled: bool
    reason: str
    warning: str | None = None


def decide_dra(dra: DRAConfig, *, policy_wants: bool, cluster_access: bool) -> Decision:
    """Whether to run the DRA plugin, and why."""
    if dra.enabled is False:
        return Decision(False, "dra.enabled is false")
    if dra.enabled is None and not policy_wants:
        return Decision(False, "dra.enabled is unset and the policy does not ask for DRA")
    why = "dra.enabled is true" if dra.enabled else "the policy asks for DRA"
    if not cluster_access:
        return Decision(
            False,
            "no cluster access",
            warning=f"DRA stays off: {why}, but there is no cluster access to publish devices",
        )
    return Decision(True, why)


def check_reconfigure(old: Config, new: Config) -> None:
    """Refuse changes that need a restart."""
    if old.dra.enabled != new.dra.enabled:
        raise ConfigError(
            f"changing dra.enabled from {old.dra.enabled} to {new.dra.enabled} needs a restart"
            " of the driver"
        )
    for field in ("node", "driver_name", "module", "root"):
        if getattr(old, field) != getattr(new, field):
            raise ConfigError(f"changing {field} needs a restart of the driver")
