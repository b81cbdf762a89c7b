"""The build-and-sign concern: kernel-module images made in the cluster.

When a Module's kernel mapping has ``build`` or ``sign`` and its image is
missing from the registry, kmm builds it with buildah in a pod from the
Module's Dockerfile and/or signs its modules with the kernel's ``sign-file``
in another, pushing only a signed image under the final name.

- :mod:`.pods`: the build, sign and preflight pods, pure builders (no I/O);
- :mod:`.scripts`: the shell scripts those pods run, and what they report;
- :mod:`.existence`: whether an image exists, remembered; checks run in the
  background (never on a reconcile's path) and requeue whoever waits;
- :mod:`.asking`: one check over the network: what it dials (the image's
  host, its realm and redirects, never loopback or link-local unless
  configured) and what a Module's author may read of the outcome;
- :mod:`.hashing`: the digest of a pod's inputs (``last-hash``);
- :mod:`.planner`: which pods to create or delete and which kernels wait for
  their image (pure); the reconciler runs it before the loader's planner,
  which skips those kernels, and sends what it wants.
Nothing here writes to the API server.
"""
