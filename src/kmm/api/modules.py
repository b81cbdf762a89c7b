"""The ``Module`` resource (``kmm.sigs.x-k8s.io/v1beta1``) as Pydantic models.

Wire names are KMM's camelCase (alias generator), Python names snake_case;
both are accepted on input (``populate_by_name``) and aliases are written on
output, so a KMM manifest validates unchanged for every field kmm supports.
Unknown fields are errors, except inside Kubernetes sub-objects that are
passed through to pods (``PassThrough``) and in k8s-defined models that allow
extra keys. ``build`` and ``sign`` (in-cluster image builds and module
signing) are KMM's, at the container and the kernel-mapping level; their
merge for one kernel is :func:`kmm.api.kernels.target`'s.

Each rule is stated twice beside each other: a Python validator (for the
operator, which repeats admission and reports a Degraded condition) and a CEL
rule (``cel.Rule``) that :mod:`kmm.api.crd` renders into the CRD. Rules a
schema cannot express live in :mod:`kmm.api.admission`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from kmm.api import cel, formats, labels, regexps

__all__ = [
    "API_VERSION",
    "DEVICE_PLUGIN_VOLUMES",
    "DRA_VOLUMES",
    "GROUP",
    "HOST_PATH_ROOTS",
    "KIND",
    "PLURAL",
    "VERSION",
    "VERSION_TRANSITION_MESSAGE",
    "Build",
    "BuildArg",
    "CELDeviceSelector",
    "Condition",
    "ContainerSpec",
    "DaemonSetStatus",
    "DeviceClassConfig",
    "DeviceClassSpec",
    "DevicePluginSpec",
    "DeviceSelector",
    "DraSpec",
    "FileToSign",
    "HostPathVolumeSource",
    "ImageState",
    "ImageStatus",
    "KanikoParams",
    "KernelMapping",
    "LocalObjectReference",
    "ModprobeArgs",
    "ModprobeSpec",
    "Module",
    "ModuleLoaderContainerSpec",
    "ModuleLoaderSpec",
    "ModuleSpec",
    "ModuleStatus",
    "ObjectMeta",
    "OpaqueDeviceConfig",
    "RegistryTLS",
    "ResourceReference",
    "Sign",
    "Toleration",
    "VersionCounts",
    "Volume",
    "VolumeMount",
]

GROUP = "kmm.sigs.x-k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Module"
PLURAL = "modules"

# Bounds on strings and lists that CEL rules read: the apiserver estimates rule
# cost from them and refuses a CRD whose rules could run unbounded.
_MAX_IMAGE = 512
_MAX_MAPPINGS = 64
_MAX_MODULE_NAME = 64  # Linux MODULE_NAME_LEN
_MAX_REGEXP = 1024
_MAX_LOADING_ORDER = 32
_MAX_CEL_EXPRESSION = 10 * 1024  # resource.k8s.io/v1 CELDeviceSelector limit
_MAX_DEVICE_CLASSES = 32
_MAX_SELECTORS = 32  # resource.k8s.io/v1 DeviceSelectorsMaxSize
_MAX_CONFIGS = 32  # resource.k8s.io/v1 DeviceConfigMaxSize
_MAX_DRIVER_NAME = 63  # resource.k8s.io/v1 DriverNameMaxLength
_MAX_VOLUMES = 64
_MAX_HOST_PATH = 4096  # PATH_MAX
_MAX_FILES_TO_SIGN = 16
_MAX_FILE_TO_SIGN = 512
_MAX_BUILD_SECRETS = 16
_MAX_DIR_NAME = 1024
_MAX_BUILD_ARG_NAME = 256

# Host paths a Module may mount into its privileged pods: device, sysfs and
# the state/runtime trees drivers use; never ``/`` or ``/etc`` (DESIGN §5).
HOST_PATH_ROOTS = ("/dev", "/sys", "/var", "/opt", "/run")
_HOST_PATH_PATTERN = "^/(" + "|".join(r[1:] for r in HOST_PATH_ROOTS) + ")(/.*)?$"
_PARENT_COMPONENT = r"(^|/)\.\.(/|$)"

PassThroughObject = Annotated[dict[str, Any], cel.PassThrough()]

_MODULE_NAME_OR_RAW_ARGS_MESSAGE = "moduleName is required unless rawArgs is set"
_RAW_ARGS_BOTH_MESSAGE = (
    "rawArgs.load and rawArgs.unload must both be set when moduleName is unset: "
    "modprobe runs rawArgs.load to load the module and rawArgs.unload to unload it"
)
_RAW_ARGS_WITH_MODULE_NAME_MESSAGE = (
    "rawArgs cannot be set when moduleName is set: use parameters and args with moduleName, "
    "or rawArgs alone"
)
VERSION_TRANSITION_MESSAGE = (
    "version may not be added to or removed from an existing Module: "
    "delete the Module and create it again with or without a version"
)


def _checked(check: Callable[[str], str | None]) -> AfterValidator:
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
    _checked(formats.image_error),
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
    _checked(formats.plain_image_error),
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
    _checked(formats.dns_subdomain_error),
    cel.Rule(
        f"self.matches({formats.DNS_SUBDOMAIN_PATTERN!r})",
        "must be a DNS subdomain: lowercase alphanumerics, '-' and '.'",
    ),
]
Regexp = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_REGEXP),
    _checked(regexps.error),
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
    _checked(formats.label_value_error),
    cel.Rule(
        f"self.matches({formats.LABEL_VALUE_PATTERN!r})",
        "must be a valid label value (it is written to node labels)",
    ),
]
# A module name is one word to modprobe, and modulesLoadingOrder entries are
# written into a modprobe.d file (kmm.operator.loader.builders), where whitespace would
# split a line or start another. One explicit class, the same in Python and RE2.
_WHITESPACE = r"[ \t\n\v\f\r]"
_MODULE_NAME_RULE = "must be a kernel module name: no whitespace"


def _module_name_error(name: str) -> str | None:
    return f"{name!r} {_MODULE_NAME_RULE}" if re.search(_WHITESPACE, name) else None


ModuleName = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_MODULE_NAME),
    _checked(_module_name_error),
    cel.Rule(f"!self.matches({_WHITESPACE!r})", _MODULE_NAME_RULE),
]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]


class _Model(BaseModel):
    """Base for kmm's own API objects: camelCase wire names, unknown keys refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )
    # CEL rules on the object itself (cross-field), rendered by kmm.api.crd.
    cel_rules: ClassVar[tuple[cel.Rule, ...]] = ()


class _K8sModel(_Model):
    """Base for Kubernetes-defined sub-objects: their fields may grow, keep extras."""

    model_config = ConfigDict(extra="allow")


class Toleration(_K8sModel):
    """core/v1 Toleration, typed because the operator decides schedulability with it."""

    # Plain strings: "" is meaningful (an empty effect tolerates every effect)
    # and the pod's own validation judges the rest.
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class LocalObjectReference(_K8sModel):
    """core/v1 LocalObjectReference (the image pull secret)."""

    name: str


class RegistryTLS(_Model):
    """How kmm reaches a registry: plain HTTP (insecure) or TLS without
    verifying the certificate (insecureSkipTLSVerify). It governs kmm's own
    registry requests (the operator's image existence checks) and the build
    and sign pods' pulls and pushes; nodes pull images as their container
    runtime's registry configuration says, as in KMM.

    An object with neither option set asks nothing (KMM's Go client writes
    ``{}`` for its unset struct).
    """

    model_config = ConfigDict(alias_generator=None)

    insecure: bool | None = None
    insecure_skip_tls_verify: bool | None = Field(default=None, alias="insecureSkipTLSVerify")

    def is_set(self) -> bool:
        """Whether an option is given (an empty object is the same as none)."""
        return self.insecure is not None or self.insecure_skip_tls_verify is not None


class ResourceReference(_K8sModel):
    """core/v1 LocalObjectReference to a ConfigMap or Secret in the Module's
    namespace that build or sign pods read. The name must be a DNS subdomain
    (an object name; a build secret's name is also a directory, /run/secrets/<name>)."""

    name: DnsSubdomain


class BuildArg(_Model):
    """One ``--build-arg`` of the image build (KMM's BuildArg)."""

    name: Annotated[str, Field(min_length=1, max_length=_MAX_BUILD_ARG_NAME)]
    value: str


class KanikoParams(_Model):
    """KMM's kaniko settings: accepted so KMM manifests apply; kmm builds
    with buildah, so they have no effect (admission warns)."""

    tag: str | None = None


# "$" only in a known variable, ${VAR} or $VAR (then no name character may
# follow). One match rather than the images' findAll: a Module may list
# hundreds of files across its mappings, and the apiserver budgets the cost
# of every rule by the most it could run. RE2 and Python's re (ASCII \b) read
# this pattern alike, so the same text judges in both.
_NAMES = "|".join(formats.IMAGE_VARIABLES)
_FILE_VARIABLES_PATTERN = rf"^([^$]|\$(\{{({_NAMES})\}}|({_NAMES})\b))*$"
_FILE_VARIABLES = re.compile(_FILE_VARIABLES_PATTERN, re.ASCII)
_FILE_VARIABLES_RULE = (
    f"may use '$' only in the variables {', '.join(formats.IMAGE_VARIABLES)} "
    "(as ${NAME} or $NAME)"
)


def _file_to_sign_error(path: str) -> str | None:
    if re.search(_PARENT_COMPONENT, path):
        return f"filesToSign entry {path!r} may not contain a '..' component"
    if not _FILE_VARIABLES.match(path):
        return f"filesToSign entry {path!r} {_FILE_VARIABLES_RULE}"
    return None


FileToSign = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_FILE_TO_SIGN),
    _checked(_file_to_sign_error),
    cel.Rule(f"!self.matches({_PARENT_COMPONENT!r})", "may not contain a '..' component"),
    cel.Rule(f"self.matches({_FILE_VARIABLES_PATTERN!r})", _FILE_VARIABLES_RULE),
]


class Build(_Model):
    """``build``: build the image in the cluster when it is missing from the
    registry, from the Dockerfile in a ConfigMap (key ``dockerfile``).

    Set at the container level, a kernel mapping's ``build`` adds to it for
    that mapping's kernels (see kernels.BuildTarget for the merge);
    dockerfileConfigMap is required at one level or the other.
    """

    build_args: list[BuildArg] | None = None
    dockerfile_config_map: ResourceReference | None = None
    base_image_registry_tls: RegistryTLS | None = Field(default=None, alias="baseImageRegistryTLS")
    secrets: Annotated[list[ResourceReference], Field(max_length=_MAX_BUILD_SECRETS)] | None = None
    kaniko_params: KanikoParams | None = None
    selector: dict[str, str] | None = None


class Sign(_Model):
    """``sign``: sign kernel modules in the image for Secure Boot with the
    key and certificate of two Secrets (keys ``key`` and ``cert``).

    Without ``build`` it signs ``unsignedImage``; with it, the image just
    built. A kernel mapping's ``sign`` adds to the container's (see
    kernels.SignTarget); keySecret, certSecret and filesToSign are required
    at one level or the other, and every filesToSign entry lies under
    modprobe.dirName.
    """

    unsigned_image: Image | None = None
    unsigned_image_registry_tls: RegistryTLS | None = Field(
        default=None, alias="unsignedImageRegistryTLS"
    )
    key_secret: ResourceReference | None = None
    cert_secret: ResourceReference | None = None
    files_to_sign: (
        Annotated[list[FileToSign], Field(min_length=1, max_length=_MAX_FILES_TO_SIGN)] | None
    ) = None


# KMM's ModprobeArgs lists carry MinItems=1: an empty list is refused, so
# "set" and "non-empty" are one test (``has``) in the rules below.
_ModprobeArgList = Annotated[list[str], Field(min_length=1)]


class ModprobeArgs(_Model):
    """Arguments for ``modprobe`` on load and unload."""

    load: _ModprobeArgList | None = None
    unload: _ModprobeArgList | None = None


class ModprobeSpec(_Model):
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

    module_name: ModuleName | None = None
    parameters: list[str] | None = None
    # Bounded: the sign rules read it (filesToSign lie under it).
    dir_name: Annotated[str, Field(max_length=_MAX_DIR_NAME)] = "/opt"
    args: ModprobeArgs | None = None
    raw_args: ModprobeArgs | None = None
    firmware_path: str | None = None
    modules_loading_order: (
        Annotated[
            list[ModuleName],
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


class KernelMapping(_Model):
    """One kernel (exact ``literal`` or ``regexp`` search) and the image for it."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "has(self.literal) != has(self.regexp)",
            "exactly one of literal and regexp must be set",
        ),
    )

    literal: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    regexp: Regexp | None = None
    container_image: Image | None = None
    in_tree_modules_to_remove: list[str] | None = None
    # Deprecated singular form KMM still accepts; see kernels.Target.
    in_tree_module_to_remove: str | None = None
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    build: Build | None = None
    sign: Sign | None = None

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


class ModuleLoaderContainerSpec(_Model):
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

    modprobe: ModprobeSpec
    kernel_mappings: Annotated[list[KernelMapping], Field(min_length=1, max_length=_MAX_MAPPINGS)]
    container_image: Image | None = None
    image_pull_policy: PullPolicy | None = None
    version: ModuleVersion | None = None
    in_tree_modules_to_remove: list[str] | None = None
    in_tree_module_to_remove: str | None = None
    registry_tls: RegistryTLS | None = Field(default=None, alias="registryTLS")
    build: Build | None = None
    sign: Sign | None = None

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


class ModuleLoaderSpec(_Model):
    """``spec.moduleLoader``: absent for in-tree drivers (device plugin / DRA only)."""

    container: ModuleLoaderContainerSpec
    service_account_name: str | None = None


class VolumeMount(_K8sModel):
    """core/v1 VolumeMount, passed through to the pod; its name must be one
    of the pod's volumes (in volumes, or one kmm mounts itself)."""

    name: Annotated[str, Field(min_length=1, max_length=63)]


class ContainerSpec(_Model):
    """A device-plugin or DRA driver container (KMM's DevicePluginContainerSpec)."""

    image: PlainImage
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[PassThroughObject] | None = None
    image_pull_policy: PullPolicy | None = None
    resources: PassThroughObject | None = None
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=_MAX_VOLUMES)] | None = None


def _host_path_error(path: str) -> str | None:
    if not re.match(_HOST_PATH_PATTERN, path):
        return f"must be under one of {', '.join(HOST_PATH_ROOTS)}, not {path!r}"
    if re.search(_PARENT_COMPONENT, path):
        return f"may not contain a '..' component: {path!r}"
    return None


HostPath = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_HOST_PATH),
    _checked(_host_path_error),
    cel.Rule(
        f"self.matches({_HOST_PATH_PATTERN!r})",
        f"must be under one of {', '.join(HOST_PATH_ROOTS)}",
    ),
    cel.Rule(f"!self.matches({_PARENT_COMPONENT!r})", "may not contain a '..' component"),
]


class HostPathVolumeSource(_K8sModel):
    """core/v1 HostPathVolumeSource, typed because its path is limited."""

    path: HostPath
    type: str | None = None


class Volume(_K8sModel):
    """core/v1 Volume: any source passes through to the pod, except that a
    hostPath must lie under /dev, /sys, /var, /opt or /run."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    host_path: HostPathVolumeSource | None = None


def _reserved_names(names: tuple[str, ...]) -> tuple[AfterValidator, cel.Rule]:
    """Volume names the operator's builder uses itself, refused in the spec
    (the pod would carry two volumes of one name and never be created)."""

    def check(volumes: list[Volume]) -> list[Volume]:
        taken = sorted({v.name for v in volumes} & set(names))
        if taken:
            raise ValueError(f"volume names {taken} are reserved for the volumes kmm mounts")
        return volumes

    return AfterValidator(check), cel.Rule(
        f"self.all(v, !(v.name in {list(names)!r}))",
        f"volume names {', '.join(names)} are reserved for the volumes kmm mounts",
    )


# The names the device-plugin and DRA builders give their own volumes.
DEVICE_PLUGIN_VOLUMES = ("kubelet-device-plugins",)
DRA_VOLUMES = ("kubelet-plugins", "kubelet-plugins-registry", "cdi")

_MOUNTS_NAMED = "every volumeMounts entry must name a volume in volumes or one kmm mounts"


def _mounts_named(names: tuple[str, ...]) -> tuple[cel.Rule, ...]:
    """CEL: the mounts of the container and the init container name a
    volume of ``volumes`` or one of the builder's own (``names``). The pod
    of a mount naming no volume is refused by the API server, so the
    DaemonSet would be accepted and never run a pod."""

    def rule(container: str, *, optional: bool) -> cel.Rule:
        mounts = f"self.{container}.volumeMounts"
        present = f"!has(self.{container}) || " if optional else ""
        return cel.Rule(
            f"{present}!has({mounts}) || {mounts}.all(m, m.name in {list(names)!r} || "
            "(has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
            f"{_MOUNTS_NAMED} ({', '.join(names)})",
            f".{container}.volumeMounts",
        )

    return (rule("container", optional=False), rule("initContainer", optional=True))


def _unnamed_mounts(
    names: tuple[str, ...],
    volumes: list[Volume] | None,
    containers: tuple[tuple[str, ContainerSpec | None], ...],
) -> None:
    """Python: ``_mounts_named``'s rule; raises naming each stray entry."""
    known = set(names) | {v.name for v in volumes or ()}
    stray = [
        f"{field}.volumeMounts[{index}] names {mount.name!r}"
        for field, spec in containers
        if spec is not None
        for index, mount in enumerate(spec.volume_mounts or ())
        if mount.name not in known
    ]
    if stray:
        raise ValueError(f"{'; '.join(stray)}: {_MOUNTS_NAMED} ({', '.join(names)})")


_PLUGIN_NAMES_FREE, _PLUGIN_NAMES_FREE_CEL = _reserved_names(DEVICE_PLUGIN_VOLUMES)
_DRA_NAMES_FREE, _DRA_NAMES_FREE_CEL = _reserved_names(DRA_VOLUMES)
DevicePluginVolumes = Annotated[
    list[Volume], Field(max_length=_MAX_VOLUMES), _PLUGIN_NAMES_FREE, _PLUGIN_NAMES_FREE_CEL
]
DraVolumes = Annotated[
    list[Volume], Field(max_length=_MAX_VOLUMES), _DRA_NAMES_FREE, _DRA_NAMES_FREE_CEL
]


class DevicePluginSpec(_Model):
    """``spec.devicePlugin``: a device-plugin DaemonSet on nodes with the module loaded."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = _mounts_named(DEVICE_PLUGIN_VOLUMES)

    container: ContainerSpec
    init_container: ContainerSpec | None = None
    service_account_name: str | None = None
    volumes: DevicePluginVolumes | None = None
    # KMM's: false keeps the service account token out of the pod.
    automount_service_account_token: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> DevicePluginSpec:
        _unnamed_mounts(
            DEVICE_PLUGIN_VOLUMES,
            self.volumes,
            (("container", self.container), ("initContainer", self.init_container)),
        )
        return self


class CELDeviceSelector(_Model):
    """resource.k8s.io/v1 CELDeviceSelector."""

    expression: Annotated[str, Field(min_length=1, max_length=_MAX_CEL_EXPRESSION)]


class DeviceSelector(_Model):
    """resource.k8s.io/v1 DeviceSelector (CEL is its only form)."""

    cel: CELDeviceSelector


class OpaqueDeviceConfig(_Model):
    """resource.k8s.io/v1 OpaqueDeviceConfiguration: parameters for one driver."""

    driver: DriverName
    parameters: PassThroughObject


class DeviceClassConfig(_Model):
    """resource.k8s.io/v1 DeviceClassConfiguration (opaque is its only form)."""

    opaque: OpaqueDeviceConfig


class DeviceClassSpec(_Model):
    """One cluster-scoped DeviceClass the DRA reconciler keeps for the Module."""

    name: DnsSubdomain
    selectors: Annotated[list[DeviceSelector], Field(max_length=_MAX_SELECTORS)] | None = None
    config: Annotated[list[DeviceClassConfig], Field(max_length=_MAX_CONFIGS)] | None = None


class DraSpec(_Model):
    """``spec.dra`` (seed 000): the DRA driver DaemonSet and the DeviceClasses."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = _mounts_named(DRA_VOLUMES)

    driver_name: DriverName
    container: ContainerSpec
    init_container: ContainerSpec | None = None
    service_account_name: str | None = None
    volumes: DraVolumes | None = None
    automount_service_account_token: bool | None = None
    device_classes: (
        Annotated[
            list[DeviceClassSpec],
            Field(max_length=_MAX_DEVICE_CLASSES),
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("name",)))
            ),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _check(self) -> DraSpec:
        _unnamed_mounts(
            DRA_VOLUMES,
            self.volumes,
            (("container", self.container), ("initContainer", self.init_container)),
        )
        return self


class ModuleSpec(_Model):
    """``Module.spec``."""

    cel_rules: ClassVar[tuple[cel.Rule, ...]] = (
        cel.Rule(
            "!(has(self.dra) && has(self.devicePlugin))",
            "dra and devicePlugin are mutually exclusive",
            ".dra",
        ),
    )

    selector: dict[str, str]
    tolerations: list[Toleration] | None = None
    image_repo_secret: LocalObjectReference | None = None
    module_loader: ModuleLoaderSpec | None = None
    device_plugin: DevicePluginSpec | None = None
    dra: DraSpec | None = None
    # KMM's: changing it has every image of the Module checked again and the
    # missing ones built; status.imageRebuildTriggerGeneration says when done.
    image_rebuild_trigger_generation: int | None = None

    @model_validator(mode="after")
    def _check(self) -> ModuleSpec:
        if self.dra is not None and self.device_plugin is not None:
            raise ValueError("dra and devicePlugin are mutually exclusive")
        return self


class VersionCounts(_Model):
    """The DaemonSets of one module version (ordered upgrades): their counts."""

    version: str
    desired_number: int = 0
    available_number: int = 0


class DaemonSetStatus(_Model):
    """Counts for one kind of DaemonSet the Module owns (KMM's field names),
    and with ``version`` set, the same per version (kmm's, not KMM's)."""

    nodes_matching_selector_number: int = 0
    desired_number: int = 0
    available_number: int = 0
    versions: (
        Annotated[
            list[VersionCounts],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("version",)))
            ),
        ]
        | None
    ) = None


class Condition(_K8sModel):
    """meta/v1 Condition: Ready / Progressing / Degraded with reasons."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


ImageState = Literal[
    "Exists",
    "Missing",
    "Checking",
    "Building",
    "Signing",
    "BuildFailed",
    "SignFailed",
    "AuthenticationFailed",
]


class ImageStatus(_Model):
    """The image of one kernel of a Module that builds or signs (kmm's, not
    KMM's): whether the registry has it, or which pod is making it, or why
    it cannot be had."""

    kernel: str
    image: str
    state: ImageState
    pod: str | None = None
    message: str | None = None


class ModuleStatus(_Model):
    """``Module.status``: KMM's counts plus conditions and observedGeneration."""

    module_loader: DaemonSetStatus | None = None
    device_plugin: DaemonSetStatus | None = None
    dra: DaemonSetStatus | None = None
    conditions: (
        Annotated[
            list[Condition],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("type",)))
            ),
        ]
        | None
    ) = None
    observed_generation: int | None = None
    # KMM's: the spec.imageRebuildTriggerGeneration whose checks and builds are done.
    image_rebuild_trigger_generation: int | None = None
    images: (
        Annotated[
            list[ImageStatus],
            cel.SchemaExtra(
                (("x-kubernetes-list-type", "map"), ("x-kubernetes-list-map-keys", ("kernel",)))
            ),
        ]
        | None
    ) = None


class ObjectMeta(_K8sModel):
    """meta/v1 ObjectMeta: the few fields kmm reads; the rest kept as extras."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    deletion_timestamp: str | None = None


class Module(_Model):
    """A ``Module``: which nodes need which kernel module, image and devices."""

    api_version: Literal["kmm.sigs.x-k8s.io/v1beta1"] = "kmm.sigs.x-k8s.io/v1beta1"
    kind: Literal["Module"] = "Module"
    metadata: ObjectMeta
    spec: ModuleSpec
    status: ModuleStatus | None = None

    @model_validator(mode="after")
    def _check(self) -> Module:
        # A Module read without a namespace (a manifest file) still gets the
        # check with the shortest possible namespace; admission checks the real one.
        name = self.metadata.name
        used = len(name) + max(1, len(self.metadata.namespace or ""))
        if used > labels.MAX_NAME_AND_NAMESPACE:
            raise ValueError(
                f"metadata.name: namespace and name total {used} characters; at most "
                f"{labels.MAX_NAME_AND_NAMESPACE} fit in the derived labels "
                f"(e.g. {labels.module_loader_version('<namespace>', '<name>')})"
            )
        return self
