"""Which resource.k8s.io version serves DeviceTaintRules, decided from discovery (pure).

Device taints (KEP-5055) came to the API in steps: ``v1alpha3`` in 1.35
(the ``DRADeviceTaintRules`` gate alpha, off), ``v1beta2`` in 1.36 (beta but
off by default, and that API version must be enabled too), ``v1`` in 1.37
(GA, on). ``taint_rules_version`` takes what discovery said each version
serves and picks the newest that serves ``devicetaintrules``; ``None``
when none does. Then ordered upgrades go on without taints (the pods
using a moving node's devices still keep its driver there:
``upgrade.taints``), and a DRA Module's status says why none was used
(``NOT_SERVED``; ``TURNED_OFF`` when the operator runs with
``--no-device-taints`` and does not ask).

The object's shape (``deviceSelector{driver, pool, device}``, ``taint{key,
value, effect}``) is the same in the three versions; the wiring asks each
version once at start (``wiring.served_versions``) and lists and writes
rules in the one chosen here (``rules_resource``).

Limits: no I/O; a server upgraded under a running operator is seen at its
next start (as the resource.k8s.io/v1 check of DRA itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Final

from kmm.kube import resources

__all__ = [
    "NOT_SERVED",
    "PLURAL",
    "TURNED_OFF",
    "VERSIONS",
    "rules_resource",
    "taint_rules_version",
]

PLURAL: Final = resources.DEVICE_TAINT_RULES.plural
GROUP: Final = resources.DEVICE_TAINT_RULES.group
# Newest first: the first that serves the rules is used.
VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")

NOT_SERVED: Final = (
    "device taints not used: the API server does not serve resource.k8s.io "
    "devicetaintrules (Kubernetes 1.37, or the DRADeviceTaintRules feature and its "
    "API version on 1.35 and 1.36); upgrades go on without them, and pods using the "
    "Module's devices keep their claims until they are deleted"
)


TURNED_OFF: Final = (
    "device taints not used: the operator runs with --no-device-taints; upgrades go on "
    "without them, and pods using the Module's devices keep their claims until they are "
    "deleted"
)


def taint_rules_version(served: Mapping[str, Collection[str]]) -> str | None:
    """The newest of ``VERSIONS`` whose discovery (``served``: version ->
    resource names, a version absent when the server does not serve it)
    lists ``devicetaintrules``; None when none does."""
    for version in VERSIONS:
        if PLURAL in served.get(version, ()):
            return version
    return None


def rules_resource(version: str) -> resources.Resource:
    """The DeviceTaintRule resource in ``version``."""
    return dataclasses.replace(resources.DEVICE_TAINT_RULES, version=version)
