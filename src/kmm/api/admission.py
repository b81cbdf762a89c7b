"""The ValidatingAdmissionPolicies (and bindings): what the CRD schema cannot
say, and warnings for the KMM fields that have no effect in kmm.

A CRD rule sees only the object; the namespace of a create request is not in
its reach, so "namespace + name short enough that every derived label fits in
63 characters" (``labels.MAX_NAME_AND_NAMESPACE``) is checked here, in CEL,
with no webhook server and no certificates (DESIGN §3).

What is *not* here, and why:

- Regexp compilation sits in the CRD, on the ``regexp`` field itself, so the
  apiserver's error names the exact list index. CEL has no "compiles"
  predicate; the rule matches with the user's pattern and an invalid pattern
  raises an evaluation error. Validating admission runs after schema
  validation, so a rule here would never see an invalid regexp anyway.
- The build and sign rules sit in the CRD too, on the loader container,
  which sees both levels a kernel mapping's build and sign merge from.

A second policy, bound with ``validationActions: [Warn]``, never refuses: it
answers with a Warning header (kubectl prints it) for a KMM field kmm accepts
but that has no effect, so a KMM manifest still applies and its author hears
what kmm will not do (DESIGN §3: accepted with an admission warning, never
silently ignored). A binding's actions hold for every validation of its
policy, hence two policies rather than one.

``deploy/admission/`` holds the committed rendering; a unit test keeps them equal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kmm.api import labels, modules

__all__ = [
    "BINDING_NAME",
    "POLICY_NAME",
    "WARNINGS_BINDING_NAME",
    "WARNINGS_POLICY_NAME",
    "NoEffect",
    "name_length_expression",
    "render",
    "warnings",
]

POLICY_NAME = f"{modules.PLURAL}.{modules.GROUP}"
BINDING_NAME = POLICY_NAME
WARNINGS_POLICY_NAME = f"warnings.{POLICY_NAME}"
WARNINGS_BINDING_NAME = WARNINGS_POLICY_NAME

_LOADER = "object.spec.moduleLoader"
_CONTAINER = f"{_LOADER}.container"
_MODPROBE = f"{_CONTAINER}.modprobe"


_BUILDS = f"(has({_CONTAINER}.build) || has(m.build))"
_UNSIGNED_IMAGE_GIVEN = (
    f"((has(m.sign) && has(m.sign.unsignedImage)) || "
    f"(has({_CONTAINER}.sign) && has({_CONTAINER}.sign.unsignedImage)))"
)
_KANIKO_REASON = "has no effect in kmm: kmm builds with buildah, not kaniko"


@dataclasses.dataclass(frozen=True)
class NoEffect:
    """One no-effect field the warnings policy names: the CEL that holds when
    the Module does not use it, and the text the API returns when it does."""

    expression: str
    message: str


def warnings() -> list[NoEffect]:
    """What the warnings policy checks, in order."""
    return [
        # KMM manifests carry it (KMM's CI Module does); buildah has no such knob.
        NoEffect(
            f"!has({_LOADER}) || !has({_CONTAINER}.build) || !has({_CONTAINER}.build.kanikoParams)",
            f"spec.moduleLoader.container.build.kanikoParams {_KANIKO_REASON}",
        ),
        NoEffect(
            f"!has({_LOADER}) || {_CONTAINER}.kernelMappings.all(m, "
            "!has(m.build) || !has(m.build.kanikoParams))",
            f"spec.moduleLoader.container.kernelMappings[].build.kanikoParams {_KANIKO_REASON}",
        ),
        # KMM documents it ("ignored if a Build is present"); the image just
        # built is the one signed.
        NoEffect(
            f"!has({_LOADER}) || {_CONTAINER}.kernelMappings.all(m, "
            f"!{_BUILDS} || !{_UNSIGNED_IMAGE_GIVEN})",
            "spec.moduleLoader.container.sign.unsignedImage and "
            "spec.moduleLoader.container.kernelMappings[].sign.unsignedImage have no effect "
            "for a kernel mapping with build (at either level): the image just built is the "
            "one signed",
        ),
        # KMM documents it ("all other properties in this object are
        # ignored"); kmm does the same, and says so.
        NoEffect(
            f"!has({_LOADER}) || has({_MODPROBE}.moduleName) || "
            f"(!has({_MODPROBE}.parameters) && !has({_MODPROBE}.args))",
            "spec.moduleLoader.container.modprobe.parameters and "
            "spec.moduleLoader.container.modprobe.args have no effect with rawArgs: "
            "modprobe runs rawArgs.load and rawArgs.unload as written",
        ),
    ]


def name_length_expression() -> str:
    """CEL: the Module's namespace and name fit the derived label budget."""
    return (
        f"size(object.metadata.name) + size(request.namespace) <= {labels.MAX_NAME_AND_NAMESPACE}"
    )


def _name_length_message() -> str:
    longest = labels.module_loader_version("<namespace>", "<name>")
    return (
        f"metadata.name: the Module's namespace and name may total at most "
        f"{labels.MAX_NAME_AND_NAMESPACE} characters, so that every label derived from "
        f"them (the longest is {longest}) fits in 63 characters"
    )


def _policy(name: str, validations: list[dict[str, Any]], *, failure: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": failure,
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [modules.GROUP],
                        "apiVersions": [modules.VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [modules.PLURAL],
                    }
                ]
            },
            "validations": validations,
        },
    }


def _binding(name: str, policy: str, action: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": [action]},
    }


def render() -> list[dict[str, Any]]:
    """The refusing policy and its binding, then the warning one and its
    binding (admissionregistration.k8s.io/v1, GA since 1.30)."""
    refusing = _policy(
        POLICY_NAME,
        [
            {
                "expression": name_length_expression(),
                "message": _name_length_message(),
                "reason": "Invalid",
            }
        ],
        failure="Fail",
    )
    warning = _policy(
        WARNINGS_POLICY_NAME,
        [{"expression": w.expression, "message": w.message} for w in warnings()],
        # A warning that cannot be evaluated must not turn into a refusal.
        failure="Ignore",
    )
    return [
        refusing,
        _binding(BINDING_NAME, POLICY_NAME, "Deny"),
        warning,
        _binding(WARNINGS_BINDING_NAME, WARNINGS_POLICY_NAME, "Warn"),
    ]
