"""An emulator of the kubelet's DRA manager (as of Kubernetes 1.37), so DRA
drivers can be tested without a node.

- ``emulator``: ``Emulator`` and its ``Options``: the whole, run side by side;
  restarts and reboots.
- ``podworkers``: the node's pods taken through their life (claims prepared,
  containers started, completed, deleted); ``podstatuses``: their status.
- ``processes``: a pod's containers as local processes; ``podenv``: what such a
  process is given; ``probes``: their probes.
- ``dra``: the DRA manager (prepare and unprepare a pod's claims);
  ``podclaims``: which claims a pod and its containers use;
  ``nodeoperations``: node operations a claim's devices skip;
  ``checkpoint``: its checkpoint, byte for byte as the kubelet's.
- ``registration``: the plugin watcher and registry; ``slicewiping``: the
  node's ResourceSlices wiped at start and after a driver's absence.
- ``health``: device health (``ResourceHealthStatus``); ``nodes``: the Node
  and its heartbeat; ``metrics``: ``/metrics``; ``fakedevices``: a fake
  module's devices as files.
"""
