"""The build-and-sign concern: kernel-module images made in the cluster.

When a Module's kernel mapping has ``build`` or ``sign`` and its image is
missing from the registry, kmm builds it with buildah in a pod from the
Module's Dockerfile and/or signs its modules with the kernel's ``sign-file``
in another, pushing only a signed image under the final name.

- :mod:`.pods`: a Module's build and sign pods, pure builders (no I/O);
- :mod:`.preflightpods`: the preflight pod, a validation's build and sign
  in one pod (pure);
- :mod:`.podparts`: the builder container and the pod around it, shared by
  both (pure);
- :mod:`.podnames`: what build, sign and preflight pods are called;
- :mod:`.scripts`: the shell scripts those pods run, and what they report;
- :mod:`.images`: a kernel's final and unsigned images, how their
  existence is asked, and what their labels say made them (an image that
  is not what the Module asks for is outdated, and made again);
- :mod:`.existence`: whether an image exists, remembered; checks run in the
  background (never on a reconcile's path) and requeue whoever waits;
- :mod:`.asking`: one check over the network: what it dials (the image's
  host, its realm and redirects, never loopback or link-local unless
  configured) and what a Module's author may read of the outcome; and the
  delete of an intermediate image once signed;
- :mod:`.pulling`: where the operator cannot decide, a node is asked with
  a pull pod (pure: the pod, the node, the verdict);
- :mod:`.inputs`: the ConfigMaps and Secrets a pod reads, read and picked;
- :mod:`.hashing`: the digest of a pod's inputs (``last-hash``);
- :mod:`.desired`: the build or sign pod a kernel needs now, stamped;
- :mod:`.podstatus`: what an observed pod says of itself (phase,
  termination, summary);
- :mod:`.settings`: the operator's build-and-sign flags;
- :mod:`.toolkit`: the build argument ``DTK_AUTO`` (the kernel's driver
  toolkit image, from the operator's template) and when a build gets it;
- :mod:`.steps`: where one kernel's image stands and its next step (the
  state machine, pure);
- :mod:`.planner`: carries the steps out for a Module: which pods to create
  or delete and which kernels wait for their image (pure); the reconciler
  runs it before the loader's planner, which skips those kernels, and
  ``kmm.operator.imagepods`` sends what it wants;
- :mod:`.concern`: the I/O around the planner (facts, inputs, the
  comparison of an image's labels, pull verdicts, deletes).
Nothing here writes to the API server; the one registry write is the
delete of an intermediate image kmm pushed (``existence.Checker.remove``). ``kmm.operator.preflight`` reuses
``preflightpods``, ``podnames``, ``images``, ``inputs``, ``hashing``,
``podstatus``, ``desired.params``, ``desired.driver_toolkit`` and
``settings``; never the planner.
"""
