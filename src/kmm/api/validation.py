"""Turning a raw Module object into a ``Module`` or a list of violations.

The operator repeats admission (DESIGN §3): a Module that slipped past it (the
policy not installed, an older CRD) is reported as a Degraded condition and an
Event with these messages, each naming the field path and the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pydantic

from kmm.api import modules

__all__ = ["InvalidModuleError", "Violation", "parse_module", "violations"]


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule: ``path`` in wire (camelCase) form, e.g.
    ``spec.moduleLoader.container.kernelMappings[1].regexp``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidModuleError(ValueError):
    """A Module object that breaks one or more rules; ``violations`` says which."""

    def __init__(self, found: list[Violation]) -> None:
        self.violations = found
        super().__init__("; ".join(str(v) for v in found))


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def violations(error: pydantic.ValidationError) -> list[Violation]:
    """The violations a Pydantic error stands for, paths in wire names."""
    found = []
    for entry in error.errors(include_url=False):
        message = entry["msg"].removeprefix("Value error, ")
        found.append(Violation(_path(tuple(entry["loc"])), message))
    return found


def parse_module(obj: Mapping[str, Any]) -> modules.Module:
    """Validate a Module object (as read from the apiserver or a manifest)."""
    try:
        return modules.Module.model_validate(obj)
    except pydantic.ValidationError as err:
        raise InvalidModuleError(violations(err)) from err
