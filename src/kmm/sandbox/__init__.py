"""A local Kubernetes control plane for development and tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
their pinned Go modules (``gotools/``), plus KWOK keeping fake nodes Ready and
their pods Running. Binaries are cached per version outside the repository.
Faults on demand for tests: ``restarting`` (stop, start, kill a component),
``partitioning`` (cut one client off the API server), ``throttling`` (hold
a write slot); ``testing.RunningSandbox`` offers all three.
Knows nothing of Modules; reads no flags or environment (``kmm.cli`` does).
"""
