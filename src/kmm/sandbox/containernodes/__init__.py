"""Container nodes: the pinned kubelet on containerd and runc, pods in real containers.

Modules: ``nodes`` (a node's files, ports and mount namespace), ``configs``
(containerd's, CNI's, the kubelet's and kube-proxy's configuration and
command lines), ``cgroups`` (the containers' cgroups, the shims),
``fakemodules`` (a loaded module's devices shown on a node), ``starting``
(planning and starting nodes), ``kind`` (the node interface, ``nodekinds``).

Node ``i`` (``<sandbox>/kubelets/<i>/``) is one holder process owning a
network namespace and a private mount namespace (``networking`` starts it
and links it to the fabric before the API server starts); containerd, the
kubelet and kube-proxy join both (``nsenter``), and containerd's shims and
the containers' runc inherit them. Inside, the fixed paths a node's software uses
(``MOUNTED``) are bind mounts of the node's own ``root/`` directories, so a
pod's hostPath ``/var/lib/kubelet/plugins`` or ``/lib/firmware`` is the
node's, never the host's; the root is made private from the host first, then
rshared inside (mounts the kubelet makes reach containerd's containers).
Where a mount point is missing on the host, the nearest existing directory is
covered by an overlay whose upper layer lies in the node's directory, so the
host never gets a new directory either.

What keeps the host as it was (``down`` undoes the rest):
- containerd names nothing outside: its registry hosts say the sandbox
  registry (CA = the sandbox CA) and, for every other host, ``_default``
  points at a closed loopback port, so a pull of an outside image fails at
  once; the sandbox image (pause) is imported from a local archive;
- runc and the shim are the pinned binaries (runc by absolute path, the
  pinned directory first on PATH, never /usr/bin's);
- containers' cgroups live under ``/kmm-sandbox-<id>/<node>`` in every
  hierarchy (``cgroup_parent``), which ``cgroups.remove_cgroups`` empties and removes;
- shims run in sessions of their own, outside the launcher's record:
  ``cgroups.kill_shims`` finds them by the node's containerd address;
- kube-proxy leaves the host's global conntrack limits alone (zero
  ``maxPerCore`` and timeouts); its rules, like the CNI bridge's, live in
  the node's namespace and go with it.

Limits: cgroup v1 (hybrid) and v2 hosts as root; IPv4 only; no cluster DNS
(the kubelet's ``resolvConf`` names nothing, its ``clusterDNS`` is a
ClusterIP nothing serves).
"""
