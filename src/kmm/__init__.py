"""kmm: kernel module management and Dynamic Resource Allocation for Kubernetes.

Subpackages, from the bottom layer up (import-linter enforces the order):

- ``kmm.api``: pure data (Module models, label names, manifests). No I/O.
- ``kmm.runtime``, ``kmm.kubeletplugin``, ``kmm.sandbox``: mechanisms that know
  nothing of Modules (controller runtime, DRA kubelet plugin library, local
  control plane).
- ``kmm.operator``, ``kmm.driver``, ``kmm.kubelet``: the processes.
- ``kmm.cli``: the only module that reads flags and environment.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
