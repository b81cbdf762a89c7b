"""``spec.moduleLoader``: which image the loader runs for which kernel.

A kernel mapping names a kernel (``literal`` or ``regexp``) and its image;
the container holds the defaults and the modprobe settings
(:mod:`kmm.api.modprobing`). Build and sign (:mod:`kmm.api.buildsign`) may
be set at either level; the rules across the two levels (what the merge for
one kernel must have) are stated here, in CEL over the container and in
Python beside them, because only the container sees both levels.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from kmm.api import buildsign, cel, fields, models, modprobing

__all__ = [
    "VERSION_TRANSITION_MESSAGE",
    "KernelMapping",
    "ModuleLoaderContainerSpec",
    "ModuleLoaderSpec",
]

# Bounds for the CEL cost estimate (see kmm.api.fields).
_MAX_MAPPINGS = 64

VERSION_TRANSITION_MESSAGE = (
    "version may not be added to or removed from an existing Module: "
    "delete the Module and create it again with or without a version"
)


class KernelMapping(models.Model):
    """One kernel (exact ``literal`` or ``regexp`` search) and the image for it."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "has(self.literal) != has(self.regexp)",
            "exactly one of literal and regexp must be set",
        ),
    )

    literal: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    regexp: fields.Regexp | None = None
    container_image: fields.Image | None = None
    in_tree_modules_to_remove: list[str] | None = None
    # Deprecated singular form KMM still accepts; see kernels.Target.
    in_tree_module_to_remove: str | None = None
    registry_tls: buildsign.RegistryTLS | None = Field(default=None, alias="registryTLS")
    build: buildsign.Build | None = None
    sign: buildsign.Sign | None = None

    @model_validator(mode="after")
    def _check(self) -> KernelMapping:
        if (self.literal is None) == (self.regexp is None):
            raise ValueError("exactly one of literal and regexp must be set")
        return self


# Build and sign, across the two levels. A kernel mapping builds when it or
# the container has ``build`` (signs likewise); what is required is required
# of the merge (kernels.target): at either level. Each rule is stated in CEL
# over ``self`` (the container) and in Python beside it, with the kernel
# mappings named by index.
_BUILDS = "(has(self.build) || has(m.build))"
_SIGNS = "(has(self.sign) || has(m.sign))"


def _given(section: str, field: str) -> str:
    """CEL: mapping ``m`` or the container sets ``section.field``."""
    return (
        f"(has(m.{section}) && has(m.{section}.{field})) || "
        f"(has(self.{section}) && has(self.{section}.{field}))"
    )


# (section, wire field, Python attribute) required of every building /
# signing kernel mapping, at one level or the other. filesToSign has
# minItems 1, so set means non-empty.
_REQUIRED_OF_MERGE = (
    ("build", "dockerfileConfigMap", "dockerfile_config_map"),
    ("sign", "keySecret", "key_secret"),
    ("sign", "certSecret", "cert_secret"),
    ("sign", "filesToSign", "files_to_sign"),
)


def _required_message(section: str, field: str) -> str:
    return (
        f"{section}.{field} is required for every kernel mapping with {section}: "
        f"set it in the kernel mapping's {section} or in container.{section}"
    )


_UNSIGNED_IMAGE_MESSAGE = (
    "sign without build needs sign.unsignedImage, the image whose modules are signed: "
    "set it in the kernel mapping's sign or in container.sign"
)
_PUSHED_DIGEST_MESSAGE = (
    "containerImage must name a tag, not a digest, when build or sign is set: "
    "kmm pushes the image it builds or signs under that name"
)
_SIGNS_IN_PLACE_MESSAGE = (
    "sign.unsignedImage must differ from containerImage: kmm pushes the signed image to "
    "containerImage, and an unsigned one already under that name would pass for it"
)
_UNDER_DIR_NAME_MESSAGE = "every sign.filesToSign entry must lie under modprobe.dirName"
# CEL: mapping m's containerImage and unsignedImage after the merge ('' if none).
_IMAGE_OF_M = (
    "(has(m.containerImage) ? m.containerImage : "
    "(has(self.containerImage) ? self.containerImage : ''))"
)
_UNSIGNED_OF_M = (
    "((has(m.sign) && has(m.sign.unsignedImage)) ? m.sign.unsignedImage : "
    "((has(self.sign) && has(self.sign.unsignedImage)) ? self.sign.unsignedImage : ''))"
)
_UNDER_DIR_NAME = "f.startsWith(self.modprobe.dirName + '/')"

_BUILD_SIGN_RULES = (
    *(
        cel.Rule(
            f"self.kernelMappings.all(m, !{_BUILDS if section == 'build' else _SIGNS} || "
            f"{_given(section, field)})",
            _required_message(section, field),
            ".kernelMappings",
        )
        for section, field, _ in _REQUIRED_OF_MERGE
    ),
    cel.Rule(
        f"self.kernelMappings.all(m, !{_SIGNS} || {_BUILDS} || {_given('sign', 'unsignedImage')})",
        _UNSIGNED_IMAGE_MESSAGE,
        ".kernelMappings",
    ),
    cel.Rule(
        f"self.kernelMappings.all(m, !({_BUILDS} || {_SIGNS}) || !{_IMAGE_OF_M}.contains('@'))",
        _PUSHED_DIGEST_MESSAGE,
        ".kernelMappings",
    ),
    # Compared as written; kernels.target compares them expanded as well.
    cel.Rule(
        f"self.kernelMappings.all(m, {_BUILDS} || {_UNSIGNED_OF_M} == '' || "
        f"{_UNSIGNED_OF_M} != {_IMAGE_OF_M})",
        _SIGNS_IN_PLACE_MESSAGE,
        ".kernelMappings",
    ),
    cel.Rule(
        "!has(self.sign) || !has(self.sign.filesToSign) || "
        f"self.sign.filesToSign.all(f, {_UNDER_DIR_NAME})",
        _UNDER_DIR_NAME_MESSAGE,
        ".sign.filesToSign",
    ),
    cel.Rule(
        "self.kernelMappings.all(m, !has(m.sign) || !has(m.sign.filesToSign) || "
        f"m.sign.filesToSign.all(f, {_UNDER_DIR_NAME}))",
        _UNDER_DIR_NAME_MESSAGE,
        ".kernelMappings",
    ),
)


def _build_sign_errors(container: ModuleLoaderContainerSpec) -> list[str]:
    """The Python twin of ``_BUILD_SIGN_RULES``: one message per broken rule."""
    errors = []
    mappings = list(enumerate(container.kernel_mappings))
    builds = {i for i, m in mappings if m.build is not None or container.build is not None}
    signs = {i for i, m in mappings if m.sign is not None or container.sign is not None}
    for section, field, attribute in _REQUIRED_OF_MERGE:
        missing = [
            i
            for i in sorted(builds if section == "build" else signs)
            if all(
                getattr(level, attribute) is None
                for level in (getattr(mappings[i][1], section), getattr(container, section))
                if level is not None
            )
        ]
        if missing:
            errors.append(f"kernelMappings {missing}: {_required_message(section, field)}")
    unsigned = [
        i
        for i in sorted(signs - builds)
        if all(
            level is None or level.unsigned_image is None
            for level in (mappings[i][1].sign, container.sign)
        )
    ]
    if unsigned:
        errors.append(f"kernelMappings {unsigned}: {_UNSIGNED_IMAGE_MESSAGE}")
    for i in sorted(builds | signs):
        image = mappings[i][1].container_image or container.container_image
        if image is not None and "@" in image:
            errors.append(f"kernelMappings[{i}].containerImage {image!r}: {_PUSHED_DIGEST_MESSAGE}")
    for i in sorted(signs - builds):
        image = mappings[i][1].container_image or container.container_image
        given = [s.unsigned_image for s in (mappings[i][1].sign, container.sign) if s is not None]
        to_sign = next((u for u in given if u is not None), None)
        if to_sign is not None and to_sign == image:
            errors.append(f"kernelMappings[{i}]: {_SIGNS_IN_PLACE_MESSAGE}")
    dir_name = container.modprobe.dir_name
    levels = [("container.sign", container.sign)] + [
        (f"kernelMappings[{i}].sign", m.sign) for i, m in mappings
    ]
    for where, sign in levels:
        for path in (sign.files_to_sign or ()) if sign is not None else ():
            if not path.startswith(dir_name + "/"):
                errors.append(
                    f"{where}.filesToSign entry {path!r}: {_UNDER_DIR_NAME_MESSAGE} ({dir_name!r})"
                )
    return errors


class ModuleLoaderContainerSpec(models.Model):
    """The loader container: modprobe settings and the kernel → image mappings.

    ``version`` turns on ordered upgrades (seed 003): each node runs the
    version its ``version-module`` label names. It may change, but not come
    or go on an existing Module (a transition rule: the operator could not
    tell the nodes' old loader from the new one).
    """

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "has(self.containerImage) || self.kernelMappings.all(m, has(m.containerImage))",
            "every kernelMappings entry needs containerImage when container.containerImage is not set",
            ".kernelMappings",
        ),
        cel.Rule(
            "has(self.version) == has(oldSelf.version)",
            VERSION_TRANSITION_MESSAGE,
            ".version",
        ),
        *_BUILD_SIGN_RULES,
    )

    modprobe: modprobing.ModprobeSpec
    kernel_mappings: Annotated[list[KernelMapping], Field(min_length=1, max_length=_MAX_MAPPINGS)]
    container_image: fields.Image | None = None
    image_pull_policy: fields.PullPolicy | None = None
    version: fields.ModuleVersion | None = None
    in_tree_modules_to_remove: list[str] | None = None
    in_tree_module_to_remove: str | None = None
    registry_tls: buildsign.RegistryTLS | None = Field(default=None, alias="registryTLS")
    build: buildsign.Build | None = None
    sign: buildsign.Sign | None = None

    @model_validator(mode="after")
    def _check(self) -> ModuleLoaderContainerSpec:
        if self.container_image is None:
            missing = [i for i, m in enumerate(self.kernel_mappings) if m.container_image is None]
            if missing:
                raise ValueError(
                    f"kernelMappings {missing} need containerImage when "
                    "container.containerImage is not set"
                )
        errors = _build_sign_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self


class ModuleLoaderSpec(models.Model):
    """``spec.moduleLoader``: absent for in-tree drivers (device plugin / DRA only)."""

    container: ModuleLoaderContainerSpec
    service_account_name: str | None = None
