"""kmm's APIs (Module, PreflightValidation) as pure data: models, validation, names, manifests.

Nothing here performs I/O or imports a client library; every other package may
import it, and it imports none of them.

- ``modules``: the ``Module`` resource (KMM wire names): names, root, spec, status;
  its spec's sections, each with its rules: ``moduleloader`` (kernel mappings),
  ``modprobing`` (how modprobe runs), ``buildsign`` (in-cluster build and
  signing), ``devices`` (device plugin and DRA).
- ``models``: the bases of every API model; ``fields``: the constrained strings
  fields use; ``kubeobjects``: the Kubernetes-defined objects the APIs embed.
- ``validation``: raw object -> ``Module`` or field-named violations.
- ``labels``: every label, annotation and finalizer name; DaemonSet names.
- ``kernels``: kernel mapping and image variable expansion.
- ``preflight``: the ``PreflightValidation`` models (v1beta2), reasons and rules.
- ``scheduling``: selector match and "schedulable node".
- ``conditions``: status condition types, reasons and setting.
- ``formats``: image / DNS / label-value / regexp checks shared by all of the above;
  ``regexps``: kernel-mapping regexps in Go's dialect on RE2 (``unicodenames``:
  Go's Unicode class names, generated).
- ``cel``: markers tying model fields to CRD rules; ``crd`` and ``admission``
  render the CRD and the ValidatingAdmissionPolicy; ``manifests`` gathers
  them (and ``examples``) into the files committed under ``deploy/``.
"""
