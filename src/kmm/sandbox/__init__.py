"""A local Kubernetes control plane for development and tests.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
their pinned Go modules (``gotools/``), and nodes of several kinds, each a
sub-package behind one interface (``nodekinds``): KWOK's (``kwoknodes``),
real kubelets on a fake runtime (``kubeletnodes``), on containerd
(``containernodes``), and qemu guests booting Debian's kernels
(``vmnodes``). ``cluster`` brings a sandbox up and down (``options`` says
what it is asked for, ``controlplane`` how the control plane runs,
``launching`` records every process). Shared parts, each its own module:
the nodes' network (``addressing``, ``namespaces``, ``fabric``, ``relay``,
``networking``), the registry (``registry``, ``pushing``), the PKI
(``pki``), the binaries (``components``, ``building``), processes
(``processes``, ``health``, ``ports``), what every node's kubelet is told
(``kubeletconfigs``), the host settings kubelets change
(``hostsysctls``) and the record (``state``). Binaries
are cached per version outside the repository.
Faults on demand for tests: ``restarting`` (stop, start, kill a component),
``partitioning`` (cut one client off the API server), ``throttling`` (hold
a write slot); ``testing.RunningSandbox`` offers all three.
Knows nothing of Modules; reads no flags or environment (``kmm.cli`` does).
"""
