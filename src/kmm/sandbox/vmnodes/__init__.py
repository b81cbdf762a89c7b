"""VM nodes: qemu guests booting Debian's own kernels under Secure Boot.

Where kernel modules are real: a VM node runs Debian bookworm with both of
its kernel lines (``kernels`` chooses them), booted OVMF -> shim -> grub ->
Debian's signed kernel, Secure Boot on by default, a sandbox key trusted
for module signatures (``firmware``).

Modules, one idea each:

- ``kernels``: the kernels, chosen once and recorded in one list that keys
  every cache built from it;
- ``images``: the node image (root filesystem, signed boot files), built by
  a build step, found by everything else;
- ``grub``, ``esp``: grub's configuration and saved default, the per-node
  ESP that carries them and the node's own settings;
- ``firmware``: OVMF, the sandbox's signing key, its enrollment in MokList;
- ``machines``, ``qemu``: a VM's files and qemu's command line and QMP;
- ``accel``: KVM where it boots a node, else TCG (the verdict cached);
- ``agent``: the guest agent (exec as root, files, reboot);
- ``nodes``: the handle the sandbox and tests use (start, exec, reboot,
  status, stop);
- ``planning``: what a sandbox's VM nodes will be (how they boot, each
  one's place and ports), checked before anything starts;
- ``kind``: the sandbox's VM nodes behind the node interface
  (``nodekinds``): booted, joined, rebooted, stopped;
- ``toolkits``: per kernel, a root filesystem that builds modules for it
  (headers, kbuild, sign-file, its compiler).
- ``toolkitimages``: each toolkit as an OCI image, the driver toolkit
  image a sandbox's registry serves as ``kmm/driver-toolkit:<kernel>``.

The network rule holds: qemu runs in the node's own network namespace (the
sandbox's) with a tap as the guest's one NIC; user-mode networking is never
configured, and nothing here adds an address to the host's namespace.
Only ``kind`` reads Kubernetes objects (its Nodes, from the API server);
nothing here reads flags or environment.
"""
