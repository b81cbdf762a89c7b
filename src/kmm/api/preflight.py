"""The ``PreflightValidation`` resource (``kmm.sigs.x-k8s.io/v1beta2``) as Pydantic models.

A cluster-scoped question from an admin: "if the nodes booted
``spec.kernelVersion``, would every Module have its image?" The operator's
preflight reconciler answers in ``status.modules``, one verdict per Module,
with KMM's reason texts (the ``REASON_*`` constants) and ``verificationStatus``
/ ``verificationStage`` values; ``image``, ``pod`` and ``observedGeneration``
are kmm's additions.

Only ``v1beta2`` exists here. KMM's ``v1beta1`` (a status map keyed by
Module name, no namespaces) would need a conversion webhook kmm does not run,
so it is not served at all.

As in :mod:`kmm.api.modules` (both derive from ``models.Model``), wire
names are camelCase, unknown keys are errors, and each spec rule is stated
twice beside each other: a Python validator (``parse``) and a CEL rule
(``cel.Rule``) that :mod:`kmm.api.crd` renders into the CRD. The kernel the validation asks about is
:func:`kernel` (a trailing ``+`` trimmed, as for node kernels).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import pydantic
from pydantic import Field

from kmm.api import cel, fields, formats, kernels, kubeobjects, models, modules, validation

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "MAX_KERNEL_VERSION",
    "PLURAL",
    "REASON_BUILD_FAILED",
    "REASON_BUILT",
    "REASON_IMAGE_EXISTS",
    "REASON_IMAGE_MISSING",
    "REASON_IN_PROGRESS",
    "REASON_MAPPING_NOT_FOUND",
    "REASON_NO_IMAGE_NEEDED",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "InvalidPreflightValidationError",
    "ModuleVerdict",
    "PreflightValidation",
    "PreflightValidationSpec",
    "PreflightValidationStatus",
    "Stage",
    "Status",
    "kernel",
    "parse",
]

GROUP: Final = modules.GROUP
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PreflightValidation"
PLURAL: Final = "preflightvalidations"
SINGULAR: Final = "preflightvalidation"
SHORT_NAMES: Final = ("pfv",)

# KMM's reason texts (statusReason), verbatim where KMM has them; the
# reconciler appends details after some (see the preflight reconciler).
REASON_MAPPING_NOT_FOUND: Final = "mapping not found"
REASON_IMAGE_EXISTS: Final = "verified image exists"
REASON_IMAGE_MISSING: Final = "verified image does not exist"
REASON_BUILD_FAILED: Final = "verified image does not exist and build/sign failed"
REASON_IN_PROGRESS: Final = "verification is not finished yet"
REASON_BUILT: Final = "verified image does not exist and build/sign succeeded"
REASON_NO_IMAGE_NEEDED: Final = "the Module has no moduleLoader: no image is needed"

Status = Literal["Success", "Failure", "InProgress"]
Stage = Literal["Image", "Done"]

# The apiserver budgets CEL cost by the longest string a rule may read.
MAX_KERNEL_VERSION: Final = 256

# Two separators, so at least three parts on [.,-] (KMM's webhook rule: the
# image variables KERNEL_X/Y/Z need them). One pattern for RE2 and Python's
# re; "[^.,-]*" rather than ".*" so newlines mean the same in both.
_THREE_PARTS_PATTERN: Final = r"[.,-][^.,-]*[.,-]"
_THREE_PARTS_RULE: Final = (
    "must split into at least three parts on '.', ',' or '-' (e.g. 6.1.0-27-amd64)"
)
_WHITESPACE_RULE: Final = "may not contain whitespace"
_RFC3339: Final = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def _kernel_version_error(value: str) -> str | None:
    if not re.search(_THREE_PARTS_PATTERN, value):
        return f"kernelVersion {value!r} {_THREE_PARTS_RULE}"
    if re.search(formats.WHITESPACE_PATTERN, value):
        return f"kernelVersion {value!r} {_WHITESPACE_RULE}"
    return None


def _date_time_error(value: str) -> str | None:
    if _RFC3339.match(value):
        try:
            datetime.datetime.fromisoformat(value.upper())
        except ValueError:
            pass
        else:
            return None
    return f"{value!r} must be an RFC 3339 date-time (e.g. 2026-07-01T12:00:00Z)"


KernelVersion = Annotated[
    str,
    Field(max_length=MAX_KERNEL_VERSION),
    fields.checked(_kernel_version_error),
    cel.Rule(f"self.matches({_THREE_PARTS_PATTERN!r})", _THREE_PARTS_RULE),
    cel.Rule(f"!self.matches({formats.WHITESPACE_PATTERN!r})", _WHITESPACE_RULE),
]
DateTime = Annotated[
    str,
    fields.checked(_date_time_error),
    cel.SchemaExtra((("format", "date-time"),)),
]


class PreflightValidationSpec(models.Model):
    """``PreflightValidation.spec``: the kernel to validate every Module against.

    ``pushBuiltImage`` false (the default) builds and signs without pushing
    anything; true pushes the final image under the Module's own name.
    """

    kernel_version: KernelVersion
    # Strict: the apiserver refuses "true" as a boolean, so Python must too.
    push_built_image: Annotated[bool, Field(strict=True)] = False


class ModuleVerdict(models.Model):
    """The verdict for one Module (``status.modules[]``, keyed by namespace and name)."""

    name: str
    namespace: str
    verification_status: Status
    verification_stage: Stage
    status_reason: str
    last_transition_time: DateTime
    image: str | None = None
    pod: str | None = None


class PreflightValidationStatus(models.Model):
    """``PreflightValidation.status``: one verdict per Module and the spec
    generation they answer."""

    modules: (
        Annotated[
            list[ModuleVerdict],
            cel.SchemaExtra(
                (
                    ("x-kubernetes-list-type", "map"),
                    ("x-kubernetes-list-map-keys", ("namespace", "name")),
                )
            ),
        ]
        | None
    ) = None
    observed_generation: int | None = None


class PreflightValidation(models.Model):
    """A ``PreflightValidation``: would every Module have its image on this kernel?"""

    api_version: Literal["kmm.sigs.x-k8s.io/v1beta2"] = "kmm.sigs.x-k8s.io/v1beta2"
    kind: Literal["PreflightValidation"] = "PreflightValidation"
    metadata: kubeobjects.ObjectMeta
    spec: PreflightValidationSpec
    status: PreflightValidationStatus | None = None


class InvalidPreflightValidationError(ValueError):
    """A PreflightValidation object that breaks one or more rules; ``violations`` says which."""

    def __init__(self, found: list[validation.Violation]) -> None:
        self.violations = found
        super().__init__("; ".join(str(v) for v in found))


def parse(raw: Mapping[str, Any]) -> PreflightValidation:
    """Validate a PreflightValidation object (as read from the apiserver or a manifest)."""
    try:
        return PreflightValidation.model_validate(raw)
    except pydantic.ValidationError as err:
        raise InvalidPreflightValidationError(validation.violations(err)) from err


def kernel(validation: PreflightValidation) -> str:
    """The kernel the validation asks about, as mappings are matched against it
    (one trailing ``+`` trimmed, as ``kernels.node_kernel`` does for nodes)."""
    return kernels.node_kernel(validation.spec.kernel_version)
