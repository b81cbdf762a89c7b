"""The constrained strings of a Module's fields, each rule stated twice.

Each type is an ``Annotated`` string carrying a Python validator (``checked``
turns a :mod:`kmm.api.formats` check into one) for the operator, which
repeats admission, and the same rule in CEL (``cel.Rule``) that
:mod:`kmm.api.crd` renders into the CRD. The bounds are there for CEL too:
the apiserver estimates a rule's cost from the longest string it may read
and refuses a CRD whose rules could run unbounded.

Strings whose rules belong to one section stay with it (``FileToSign`` in
:mod:`kmm.api.buildsign`, host paths in :mod:`kmm.api.devices`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from kmm.api import cel, formats, regexps

__all__ = [
    "NO_PARENT_COMPONENT",
    "PARENT_COMPONENT_PATTERN",
    "DnsSubdomain",
    "DriverName",
    "Image",
    "ModuleName",
    "ModuleVersion",
    "PassThroughObject",
    "PlainImage",
    "PullPolicy",
    "Regexp",
    "checked",
]

_MAX_IMAGE = 512
_MAX_MODULE_NAME = 64  # Linux MODULE_NAME_LEN
_MAX_REGEXP = 1024
_MAX_DRIVER_NAME = 63  # resource.k8s.io/v1 DriverNameMaxLength

# A path component "..": refused in the paths a Module names on a node
# (files to sign, host paths), in Python by the pattern and in CEL by the rule.
PARENT_COMPONENT_PATTERN = r"(^|/)\.\.(/|$)"
NO_PARENT_COMPONENT = cel.Rule(
    f"!self.matches({PARENT_COMPONENT_PATTERN!r})", "may not contain a '..' component"
)

PassThroughObject = Annotated[dict[str, Any], cel.PassThrough()]


def checked(check: Callable[[str], str | None]) -> AfterValidator:
    """Turn a ``formats`` check (error text or None) into a Pydantic validator."""

    def validate(value: str) -> str:
        error = check(value)
        if error is not None:
            raise ValueError(error)
        return value

    return AfterValidator(validate)


def _reference_rules(literal: str) -> tuple[cel.Rule, cel.Rule]:
    """The reference grammar and name length over the CEL expression
    ``literal`` (the image, its variables substituted), as ``formats.image_error``."""
    return (
        cel.Rule(
            f"{literal}.matches({formats.IMAGE_REFERENCE_PATTERN!r})",
            formats.IMAGE_REFERENCE_MESSAGE,
        ),
        cel.Rule(
            f"size({literal}.find({formats.IMAGE_NAME_PREFIX_PATTERN!r})) "
            f"<= {formats.MAX_IMAGE_NAME}",
            formats.IMAGE_NAME_LENGTH_MESSAGE,
        ),
    )


# Both spellings of every known variable, as CEL list literal items.
_PLACEHOLDERS = [f"${{{v}}}" for v in formats.IMAGE_VARIABLES] + [
    f"${v}" for v in formats.IMAGE_VARIABLES
]
Image = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_IMAGE),
    checked(formats.image_error),
    cel.Rule(
        f"self.matches({formats.IMAGE_PATTERN!r})",
        "must name an explicit tag (name:tag) or digest (name@sha256:...)",
    ),
    cel.Rule(
        f"self.findAll({formats.PLACEHOLDER.pattern!r}).all(v, v in {_PLACEHOLDERS!r})",
        f"may only use the variables {', '.join(formats.IMAGE_VARIABLES)}",
    ),
    *_reference_rules(formats.cel_substituted("self")),
]
# Device-plugin and DRA images go to the pod as written (KMM expands
# variables only in kernel-mapping images); a variable would never be pulled.
PlainImage = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_IMAGE),
    checked(formats.plain_image_error),
    cel.Rule(
        f"!self.matches({formats.VARIABLE_CHARACTERS_PATTERN!r})",
        f"may not use variables ({', '.join(formats.IMAGE_VARIABLES)}): "
        "they are expanded only in moduleLoader images",
    ),
    cel.Rule(
        f"self.matches({formats.IMAGE_PATTERN!r})",
        "must name an explicit tag (name:tag) or digest (name@sha256:...)",
    ),
    *_reference_rules("self"),
]
DnsSubdomain = Annotated[
    str,
    Field(min_length=1, max_length=253),
    checked(formats.dns_subdomain_error),
    cel.Rule(
        f"self.matches({formats.DNS_SUBDOMAIN_PATTERN!r})",
        "must be a DNS subdomain: lowercase alphanumerics, '-' and '.'",
    ),
]
Regexp = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_REGEXP),
    checked(regexps.error),
    # CEL has no "compiles" function; matching with a non-constant pattern
    # raises an evaluation error for an invalid one, which the apiserver
    # reports against this field. "||" absorbs errors only beside a true
    # operand, so both operands carry the match.
    cel.Rule("''.matches(self) || !''.matches(self)", "must be a valid RE2 regular expression"),
]
DriverName = Annotated[DnsSubdomain, Field(max_length=_MAX_DRIVER_NAME)]
ModuleVersion = Annotated[
    str,
    Field(min_length=1, max_length=63),
    checked(formats.label_value_error),
    cel.Rule(
        f"self.matches({formats.LABEL_VALUE_PATTERN!r})",
        "must be a valid label value (it is written to node labels)",
    ),
]
# A module name is one word to modprobe, and modulesLoadingOrder entries are
# written into a modprobe.d file (kmm.operator.loader.builders), where whitespace would
# split a line or start another.
_MODULE_NAME_RULE = "must be a kernel module name: no whitespace"


def _module_name_error(name: str) -> str | None:
    return f"{name!r} {_MODULE_NAME_RULE}" if re.search(formats.WHITESPACE_PATTERN, name) else None


ModuleName = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_MODULE_NAME),
    checked(_module_name_error),
    cel.Rule(f"!self.matches({formats.WHITESPACE_PATTERN!r})", _MODULE_NAME_RULE),
]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
