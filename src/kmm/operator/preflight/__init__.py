"""PreflightValidation: will every Module have an image for a kernel the
nodes do not run yet (issue 26).

A cluster-scoped ``PreflightValidation`` names a kernel; its status says,
per Module, whether an image exists for it, or can be built and signed:

- :mod:`.verdicts` (pure): a verdict, and each Module resolved for the
  kernel (no image needed, mapping not found, or its ``kernels.Target``);
- :mod:`.planner` (pure): each Module's verdict (``kmm.api.preflight``'s
  reason texts) from the registry's facts, the ConfigMaps and Secrets a pod
  reads and the validation's *preflight pods*; which pods to create and
  delete;
- :mod:`.status` (pure): the status, whose ``lastTransitionTime`` moves
  only when a verdict does;
- :mod:`.reconciler`: the I/O around it, keyed by the validation's name:
  registry facts through the build concern's ``existence.Checker`` (the
  same instance, so a converged validation asks no registry; a check runs
  in the background and requeues the validation), GETs of the
  inputs, pod creates and deletes and the status write (status
  subresource), each only when something changed.

A preflight pod (``build.preflightpods.preflight_pod``) builds and/or signs in one
pod and pushes nothing unless ``pushBuiltImage`` is true, then only the
final image under the Module's name. It lives in the Module's namespace,
owned by the validation: deleting the validation deletes its pods (the
garbage collector). Succeeded and failed pods are kept while the
validation exists, as the record of their verdict: the build concern's
``--build-pod-retention`` does not apply to them. A failed one is replaced
only once its input hash changes (Dockerfile, Secrets, build arguments,
kernel, ``pushBuiltImage`` ...), looked at every ``--build-input-poll``.

The Module reconciler ignores these pods although they carry the Module's
labels (``caches`` leaves them out of its Module index and events).
Nothing here changes a Module.
"""
