"""The Kubernetes release integration sandboxes run (no tests here).

``make test-compat K8S=VERSION`` sets ``KMM_TEST_KUBERNETES_VERSION`` and runs
the tests marked ``compat`` (a Module converging, DRA end to end on a real
kubelet, an ordered upgrade) on that release's control plane and kubelets;
unset, sandboxes run the default release (``kubereleases.DEFAULT``), as
``.ci/run`` does.
"""

from __future__ import annotations

import os

ENVIRONMENT = "KMM_TEST_KUBERNETES_VERSION"


def version() -> str:
    """The release asked for ("" for the default)."""
    return os.environ.get(ENVIRONMENT, "")
