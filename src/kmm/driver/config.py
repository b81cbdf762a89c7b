"""The node driver's configuration, and the rules for turning DRA on.

``Config`` is what ``kmm driver`` runs with: flags, the environment the
operator's DRA DaemonSet sets (``NODE_NAME``, ``DRIVER_NAME``, ``CDI_ROOT``,
``KUBELET_REGISTRAR_DIRECTORY_PATH``, ``KUBELET_PLUGINS_DIRECTORY_PATH``,
``HEALTHCHECK_PORT``, ``POD_UID``, ``KMM_MODULE_NAME``) and the optional settings file
(``--config FILE``, ``FileSettings``):

.. code-block:: yaml

    dra:
      enabled: true         # true, false, or absent (the policy decides)
    deviceClass: mydev      # /sys/class/<class> to discover devices in
    devicePattern: "mydev*" # glob of their /dev nodes
    pollInterval: 10        # seconds between device scans (health, slices)
    logLevel: info          # info or debug

A flag given on the command line wins over the file. The file is read again
when it changes: ``deviceClass``, ``devicePattern``, ``pollInterval`` and
``logLevel`` are applied at once; a change of ``dra.enabled`` is refused
(``check_reconfigure``) and the driver keeps running as it was.

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
from typing import Literal

import pydantic
import yaml

__all__ = [
    "Config",
    "ConfigError",
    "DRAConfig",
    "Decision",
    "FileSettings",
    "check_reconfigure",
    "decide_dra",
    "load_file",
]


class ConfigError(Exception):
    """A configuration that cannot be applied (as given, or without a restart)."""


@dataclasses.dataclass(frozen=True)
class DRAConfig:
    enabled: bool | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything ``kmm driver`` was told; ``root`` prefixes every host path
    not given on its own (the kubelet's directories, the CDI directory, /sys, /dev)."""

    node: str
    driver_name: str
    module: str
    device_class: str | None = None
    dev_pattern: str | None = None
    root: pathlib.Path = pathlib.Path("/")
    dra: DRAConfig = DRAConfig()
    registrar_dir: pathlib.Path | None = None  # default <root>/var/lib/kubelet/plugins_registry
    plugins_dir: pathlib.Path | None = None  # default <root>/var/lib/kubelet/plugins
    cdi_dir: pathlib.Path | None = None  # default <root>/var/run/cdi
    sys_dir: pathlib.Path | None = None  # the host's /sys; default <root>/sys
    dev_dir: pathlib.Path | None = None  # the host's /dev; default <root>/dev
    health_port: int | None = None  # gRPC health (liveness) on this port; None: not served
    pod_uid: str | None = None  # the driver pod's, when it runs in one
    # The loaded kernel module the devices need (the Module's moduleName): while
    # it is not loaded every device is Unhealthy. None: only /dev nodes count.
    kernel_module: str | None = None
    poll_interval: float = 10.0
    log_level: Literal["info", "debug"] = "info"


class _DRAFile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = None


class FileSettings(pydantic.BaseModel):
    """``--config FILE``: what may be set there (unknown keys are refused)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    dra: _DRAFile = _DRAFile()
    device_class: str | None = pydantic.Field(default=None, alias="deviceClass")
    dev_pattern: str | None = pydantic.Field(default=None, alias="devicePattern")
    poll_interval: float = pydantic.Field(default=10.0, alias="pollInterval", gt=0)
    log_level: Literal["info", "debug"] = pydantic.Field(default="info", alias="logLevel")


def load_file(path: pathlib.Path) -> FileSettings:
    """The settings file; ``ConfigError`` naming the file, the field and the rule."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: {err}") from err
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    try:
        return FileSettings.model_validate(document)
    except pydantic.ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"{path}: {problems}") from err


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
    for field in (
        "node",
        "driver_name",
        "module",
        "root",
        "registrar_dir",
        "plugins_dir",
        "cdi_dir",
        "sys_dir",
        "dev_dir",
        "health_port",
        "kernel_module",
    ):
        if getattr(old, field) != getattr(new, field):
            raise ConfigError(f"changing {field} needs a restart of the driver")
