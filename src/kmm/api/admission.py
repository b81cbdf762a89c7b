"""The ValidatingAdmissionPolicy (and binding) for what the CRD schema cannot say.

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
- ``build`` / ``sign`` are refused by CRD rules: pruning removes undeclared
  fields before any admission policy runs, so the CRD declares them.

``deploy/admission/`` holds the committed rendering; a unit test keeps them equal.
"""

from __future__ import annotations

from typing import Any

from kmm.api import labels, modules

__all__ = ["BINDING_NAME", "POLICY_NAME", "name_length_expression", "render"]

POLICY_NAME = f"{modules.PLURAL}.{modules.GROUP}"
BINDING_NAME = POLICY_NAME


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


def render() -> list[dict[str, Any]]:
    """The policy and its binding (admissionregistration.k8s.io/v1, GA since 1.30)."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
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
            "validations": [
                {
                    "expression": name_length_expression(),
                    "message": _name_length_message(),
                    "reason": "Invalid",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": BINDING_NAME},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]
