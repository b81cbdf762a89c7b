"""Every manifest in ``deploy/``, rendered from kmm.api, and where each is committed.

``kmm manifests`` prints ``documents()``; the files under ``deploy/`` are the
committed rendering (``FILES``), kept equal by a unit test, so a reviewer sees
schema changes in diffs. Rendering is deterministic: key order is the
builders' order, never sorted, so diffs stay small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from kmm.api import admission, crd, examples, installation

__all__ = ["FILES", "documents", "dump", "files"]

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


def dump(objects: list[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML text."""
    return yaml.safe_dump_all(objects, sort_keys=False, width=100, allow_unicode=True)


def files() -> dict[str, str]:
    """The text of every committed file under ``deploy/``, keyed by relative path."""
    return {path: dump(build()) for path, build in FILES.items()}


def documents() -> list[dict[str, Any]]:
    """Everything in ``deploy/``, in apply order (namespace and CRD first)."""
    return [obj for build in FILES.values() for obj in build()]
