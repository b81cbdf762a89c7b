"""How a Module's loader pod runs ``modprobe``: ``ModprobeSpec``.

KMM's webhook rules (moduleName xor rawArgs; rawArgs needs both lists) with
its messages, stated in Python and in CEL beside each other. Which image the
loader runs for which kernel is :mod:`kmm.api.moduleloader`'s.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from kmm.api import cel, fields, models

__all__ = ["ModprobeArgs", "ModprobeSpec"]

# Bounds for the CEL cost estimate (see kmm.api.fields).
_MAX_LOADING_ORDER = 32
_MAX_DIR_NAME = 1024

_MODULE_NAME_OR_RAW_ARGS_MESSAGE = "moduleName is required unless rawArgs is set"
_RAW_ARGS_BOTH_MESSAGE = (
    "rawArgs.load and rawArgs.unload must both be set when moduleName is unset: "
    "modprobe runs rawArgs.load to load the module and rawArgs.unload to unload it"
)
_RAW_ARGS_WITH_MODULE_NAME_MESSAGE = (
    "rawArgs cannot be set when moduleName is set: use parameters and args with moduleName, "
    "or rawArgs alone"
)


# KMM's ModprobeArgs lists carry MinItems=1: an empty list is refused, so
# "set" and "non-empty" are one test (``has``) in the rules below.
_ModprobeArgList = Annotated[list[str], Field(min_length=1)]


class ModprobeArgs(models.Model):
    """Arguments for ``modprobe`` on load and unload."""

    load: _ModprobeArgList | None = None
    unload: _ModprobeArgList | None = None


class ModprobeSpec(models.Model):
    """How the loader pod runs ``modprobe``."""

    # KMM's webhook rules (moduleName xor rawArgs; rawArgs needs both lists),
    # with its messages: the loader runs rawArgs.load on load and
    # rawArgs.unload on unload, so a half-set rawArgs could load a module it
    # can never unload. An empty ``rawArgs: {}`` beside moduleName says nothing
    # and KMM accepts it; so does kmm.
    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "has(self.moduleName) || has(self.rawArgs)",
            _MODULE_NAME_OR_RAW_ARGS_MESSAGE,
            ".moduleName",
        ),
        cel.Rule(
            "has(self.moduleName) || !has(self.rawArgs) || "
            "(has(self.rawArgs.load) && has(self.rawArgs.unload))",
            _RAW_ARGS_BOTH_MESSAGE,
            ".rawArgs",
        ),
        cel.Rule(
            "!has(self.moduleName) || !has(self.rawArgs) || "
            "(!has(self.rawArgs.load) && !has(self.rawArgs.unload))",
            _RAW_ARGS_WITH_MODULE_NAME_MESSAGE,
            ".rawArgs",
        ),
        cel.Rule(
            "!has(self.modulesLoadingOrder) || "
            "(has(self.moduleName) && self.modulesLoadingOrder[0] == self.moduleName)",
            "modulesLoadingOrder must start with moduleName",
            ".modulesLoadingOrder",
        ),
    )

    module_name: fields.ModuleName | None = None
    parameters: list[str] | None = None
    # Bounded: the sign rules read it (filesToSign lie under it).
    dir_name: Annotated[str, Field(max_length=_MAX_DIR_NAME)] = "/opt"
    args: ModprobeArgs | None = None
    raw_args: ModprobeArgs | None = None
    firmware_path: str | None = None
    modules_loading_order: (
        Annotated[
            list[fields.ModuleName],
            Field(min_length=2, max_length=_MAX_LOADING_ORDER),
            # A set list: the apiserver itself rejects duplicates.
            cel.SchemaExtra((("x-kubernetes-list-type", "set"),)),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _check(self) -> ModprobeSpec:
        raw = self.raw_args
        if self.module_name is None and raw is None:
            raise ValueError(_MODULE_NAME_OR_RAW_ARGS_MESSAGE)
        if self.module_name is None and raw is not None and not (raw.load and raw.unload):
            raise ValueError(_RAW_ARGS_BOTH_MESSAGE)
        if self.module_name is not None and raw is not None and (raw.load or raw.unload):
            raise ValueError(_RAW_ARGS_WITH_MODULE_NAME_MESSAGE)
        order = self.modules_loading_order
        if order is not None:
            if order[0] != self.module_name:
                raise ValueError(
                    f"modulesLoadingOrder must start with moduleName {self.module_name!r}, "
                    f"not {order[0]!r}"
                )
            duplicates = sorted({entry for entry in order if order.count(entry) > 1})
            if duplicates:
                raise ValueError(f"modulesLoadingOrder lists {duplicates} more than once")
        return self
