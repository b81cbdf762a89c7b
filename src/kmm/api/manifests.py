"""Every manifest in ``deploy/``, rendered from kmm.api, and where each is committed.

``kmm manifests`` prints ``documents()``: the install (namespace, CRDs,
admission policy, RBAC, the operator's Deployment) and nothing else, since
``kmm manifests | kubectl apply -f -`` must not put demo Modules, a Pod and
a ResourceClaimTemplate into a user's cluster; ``documents(examples=True)``
is the examples alone (``kmm manifests --examples``), applied once the
operator runs. The files under ``deploy/`` are the committed rendering
(``FILES``, both parts), kept equal by a unit test, so a reviewer sees
schema changes in diffs. Rendering is deterministic: key order is the
builders' order, never sorted, so diffs stay small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from kmm.api import admission, crd, examples, installation

__all__ = ["EXAMPLES", "FILES", "documents", "dump", "files"]

# deploy/-relative path -> the objects in it, in apply order: the operator's
# namespace, the API and its admission policy, RBAC, the operator, then the
# examples (which need the CRD established and the operator running).
FILES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "operator/namespace.yaml": installation.namespace_and_account,
    "crd/modules.kmm.sigs.x-k8s.io.yaml": lambda: [crd.render()],
    "crd/preflightvalidations.kmm.sigs.x-k8s.io.yaml": lambda: [crd.render_preflight()],
    "admission/modules.kmm.sigs.x-k8s.io.yaml": admission.render,
    "rbac/operator.yaml": lambda: installation.cluster_rbac() + installation.leader_election_rbac(),
    "operator/deployment.yaml": lambda: [installation.deployment()],
    "examples/module.yaml": lambda: [examples.module()],
    "examples/dra-module.yaml": examples.dra_module_objects,
    "examples/dra-workload.yaml": examples.dra_workload,
    "operator/examples/demo-module.yaml": lambda: [examples.demo_module()],
}

# The FILES that are examples, not the install: Modules, the DRA example's
# driver account and role, a workload Pod and its ResourceClaimTemplate.
EXAMPLES: frozenset[str] = frozenset(
    {
        "examples/module.yaml",
        "examples/dra-module.yaml",
        "examples/dra-workload.yaml",
        "operator/examples/demo-module.yaml",
    }
)


def dump(objects: list[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML text."""
    return yaml.safe_dump_all(objects, sort_keys=False, width=100, allow_unicode=True)


def files() -> dict[str, str]:
    """The text of every committed file under ``deploy/``, keyed by relative path."""
    return {path: dump(build()) for path, build in FILES.items()}


def documents(*, examples: bool = False) -> list[dict[str, Any]]:
    """The install manifests in apply order (namespace and CRDs first), or
    with ``examples`` the examples alone, in theirs."""
    return [
        obj for path, build in FILES.items() if (path in EXAMPLES) == examples for obj in build()
    ]
