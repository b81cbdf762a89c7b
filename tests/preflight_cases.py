"""PreflightValidations the API takes, and the ways to break its rules, shared
by the unit test (the Python validators) and the integration test (the API
server's CRD schema and CEL rules): each bad case names the field and the rule
in both, so the two verdicts can be compared. Not a test module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from kmm.api import preflight

Obj = dict[str, Any]


def validation(kernel: str = "6.1.0-27-amd64", *, name: str = "pfv-cases", **spec: Any) -> Obj:
    """A valid PreflightValidation object (callers mutate it)."""
    return {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "metadata": {"name": name},
        "spec": {"kernelVersion": kernel, **spec},
    }


# Kernel versions both halves accept: KMM's documented shapes, a node
# kernel's trailing "+", commas, the longest allowed.
GOOD_KERNELS: Final = (
    "6.1.0-27-amd64",
    "6.8.0-45-generic",
    "5.14.0-427.el9.x86_64+",
    "4,18,0",
    "1.2-3",
    "a.b.c",
    "6.1." + "0" * (preflight.MAX_KERNEL_VERSION - 4),
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One broken rule: Python reports ``message`` at ``path``; the API server
    refuses naming ``field`` with ``cel_message`` (``message`` unless the
    schema, not a rule, refuses)."""

    name: str
    mutate: Callable[[Obj], None]
    path: str
    message: str
    field: str
    cel_message: str | None = None


def _kernel(value: object) -> Callable[[Obj], None]:
    return lambda obj: obj["spec"].__setitem__("kernelVersion", value)


def _drop_kernel(obj: Obj) -> None:
    del obj["spec"]["kernelVersion"]


def _drop_spec(obj: Obj) -> None:
    del obj["spec"]


_PARTS = "must split into at least three parts on '.', ',' or '-'"
_SPACE = "may not contain whitespace"
_K = "spec.kernelVersion"

CASES: Final = (
    Case("kernel-two-parts", _kernel("6.1"), _K, _PARTS, _K),
    Case("kernel-one-part", _kernel("6"), _K, _PARTS, _K),
    Case("kernel-plus-only", _kernel("6.1+"), _K, _PARTS, _K),
    Case("kernel-empty", _kernel(""), _K, _PARTS, _K),
    Case("kernel-space", _kernel("6.1.0 -27"), _K, _SPACE, _K),
    Case("kernel-tab", _kernel("\t6.1.0-27"), _K, _SPACE, _K),
    Case("kernel-newline", _kernel("6.1.0-27\n"), _K, _SPACE, _K),
    Case(
        "kernel-too-long",
        _kernel("6.1." + "0" * (preflight.MAX_KERNEL_VERSION - 3)),
        _K,
        f"at most {preflight.MAX_KERNEL_VERSION} characters",
        _K,
        "Too long",
    ),
    Case("kernel-missing", _drop_kernel, _K, "Field required", _K, "Required value"),
    Case(
        "kernel-not-a-string",
        _kernel(6),
        _K,
        "valid string",
        _K,
        "must be of type string",
    ),
    Case(
        "push-not-a-boolean",
        lambda obj: obj["spec"].__setitem__("pushBuiltImage", "true"),
        "spec.pushBuiltImage",
        "valid boolean",
        "spec.pushBuiltImage",
        "must be of type boolean",
    ),
    Case("spec-missing", _drop_spec, "spec", "Field required", "spec", "Required value"),
)
