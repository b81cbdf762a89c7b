"""Kubelet nodes: the pinned kubelet on a fake container runtime.

``nodes``: one node's files, ports, configuration and command lines, and the
host paths it covers in its namespaces; ``kind``: the sandbox's kubelet
nodes behind the node interface (``nodekinds``).
"""
