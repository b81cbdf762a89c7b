"""The Kubernetes releases a sandbox can run, and what each one needs.

One row per supported minor: its pinned wrapper module
(``gotools/kubernetes/v<minor>``, written by ``scripts/kubernetes_wrapper.py``
with its own ``go.sum``; the patch version is read from that ``go.mod``, so
the pin lives in one place), the commit its tag points at when known, and the
feature gates the sandbox turns on per component. A gate is listed only for
the releases that know it: a component refuses to start on a gate its
release has removed (or never had), so the table, not a shared flag list,
says what each release is given.

What the gates are for: ``ResourceHealthStatus`` (alpha and off in 1.35,
beta and on from 1.36) lets the API server keep, and the kubelet write, the
device health of ``status.containerStatuses[].allocatedResourcesStatus``.
Device taints (``DRADeviceTaints``, ``DRADeviceTaintRules``) are GA and on
in 1.37; in 1.35 (alpha) and 1.36 (``DRADeviceTaintRules`` beta, off, on an
API version that is off) they are left at their defaults, as a cluster of
that release runs them, so kmm's path without them is what a sandbox of an
older release shows.

Limits: the newest patch of each minor that the module proxy served when
the row was added; other patches are not built.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Final

__all__ = ["DEFAULT", "RELEASES", "FeatureGates", "Release", "find", "flag", "supported"]


@dataclasses.dataclass(frozen=True)
class FeatureGates:
    """The ``--feature-gates`` each component of a release is started with."""

    apiserver: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    controller_manager: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    scheduler: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    # KubeletConfiguration.featureGates of every kubelet node (fake-runtime,
    # container and VM nodes alike).
    kubelet: Mapping[str, bool] = dataclasses.field(default_factory=dict)


def flag(gates: Mapping[str, bool]) -> list[str]:
    """``--feature-gates=A=true,B=false``, or nothing when there are none."""
    if not gates:
        return []
    joined = ",".join(f"{name}={str(value).lower()}" for name, value in sorted(gates.items()))
    return [f"--feature-gates={joined}"]


@dataclasses.dataclass(frozen=True)
class Release:
    """One supported Kubernetes minor release."""

    minor: str  # "1.37"
    # The commit the pinned tag points at, stamped as gitCommit; "" when not
    # known here (the module proxy of this machine serves no origin record):
    # the binaries then report an empty gitCommit rather than a made-up one.
    commit: str
    gates: FeatureGates

    @property
    def directory_name(self) -> str:
        """The wrapper module's directory under ``gotools/kubernetes``."""
        return f"v{self.minor}"

    @property
    def version(self) -> str:
        """The pinned patch ("v1.37.2"), as the wrapper's ``go.mod`` requires it."""
        go_mod = (
            resources.files("kmm.sandbox")
            .joinpath("gotools", "kubernetes", self.directory_name, "go.mod")
            .read_text()
        )
        match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", go_mod, re.M)
        if match is None:
            raise RuntimeError(
                f"the {self.minor} wrapper's go.mod does not require k8s.io/kubernetes"
            )
        return match.group(1)


_HEALTH = MappingProxyType({"ResourceHealthStatus": True})

RELEASES: Final[Mapping[str, Release]] = MappingProxyType(
    {
        # Corroborated by the release's own /version: gitCommit with
        # buildDate 2026-04-15T18:01:23Z, a second after the module's
        # publication time.
        "1.35": Release(
            minor="1.35",
            commit="7b8c6cf0edd376b3d7c2f255142977c7f93db258",
            gates=FeatureGates(apiserver=_HEALTH, kubelet=_HEALTH),
        ),
        "1.36": Release(minor="1.36", commit="", gates=FeatureGates()),
        "1.37": Release(minor="1.37", commit="", gates=FeatureGates()),
    }
)
DEFAULT: Final = RELEASES["1.37"]


def supported() -> str:
    """The minors a sandbox runs, for messages: "1.35, 1.36, 1.37"."""
    return ", ".join(RELEASES)


def find(asked: str) -> Release:
    """The release ``asked`` names: "", "1.37", "1.37.2" or "v1.37.2" ("" is
    the default). A patch other than the pinned one is refused, since only
    the pinned one is built. ValueError names the flag and the supported
    versions."""
    if not asked:
        return DEFAULT
    match = re.fullmatch(r"v?(1\.\d+)(?:\.(\d+))?", asked.strip())
    if match is None or match.group(1) not in RELEASES:
        raise ValueError(
            f"--kubernetes-version {asked!r}: supported are {supported()} "
            "(a minor, or its pinned patch)"
        )
    release = RELEASES[match.group(1)]
    if match.group(2) is not None:
        version = release.version
        if version != f"v{release.minor}.{match.group(2)}":
            raise ValueError(
                f"--kubernetes-version {asked!r}: kmm pins {version} for {release.minor}; "
                "other patches are not built"
            )
    return release
