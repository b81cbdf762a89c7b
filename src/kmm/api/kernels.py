"""Kernel mapping (DESIGN §3): which image, if any, a node's kernel gets.

Facts from KMM: the node's kernel is ``status.nodeInfo.kernelVersion`` with one
trailing ``+`` trimmed; mappings are tried in order and the first match wins;
``literal`` is exact, ``regexp`` an unanchored search (users write ``^…$``);
no match means the node is not targeted. Images expand ``${VAR}`` and ``$VAR``
with the variables of ``variables``; an unknown variable is an error here
rather than KMM's silent empty string, so a typo cannot produce a wrong image.

Regexps run on RE2 (:mod:`kmm.api.regexps`), linear in the kernel string,
exactly as KMM's Go ``regexp`` matches them.

``build`` and ``sign`` merge as KMM merges them (the container level is the
base; a mapping's ConfigMap, unsigned image and Secrets replace it; build
args merge by name; build secrets and filesToSign append), except that where
KMM silently drops a mapping's setting (``build.selector``,
``baseImageRegistryTLS``, ``sign.unsignedImageRegistryTLS``) beside a
container-level section, the mapping's wins here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from kmm.api import buildsign, formats, moduleloader, modules, regexps

__all__ = [
    "VARIABLES",
    "BuildTarget",
    "Grouping",
    "KernelMappingError",
    "SignTarget",
    "Target",
    "expand",
    "find_mapping",
    "group_nodes",
    "node_kernel",
    "tag_safe",
    "target",
    "variables",
]

VARIABLES = formats.IMAGE_VARIABLES

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SEPARATORS = re.compile(r"[.,-]")


class KernelMappingError(ValueError):
    """A kernel or image that cannot be resolved (e.g. fewer than 3 version parts)."""


@dataclasses.dataclass(frozen=True)
class BuildTarget:
    """How the image of one kernel is built: the merge of the container's and
    the matching mapping's ``build``.

    ``build_args`` are the user's only, merged by name (the mapping's value
    wins, the container's order kept, new names appended); the pod builder
    adds KERNEL_VERSION and the like over them. ``secrets`` are the
    container's then the mapping's, each once. ``dockerfile_config_map``,
    ``base_image_registry_tls`` and ``selector`` are the mapping's when it
    sets them, else the container's (an empty TLS object or selector sets
    nothing, as KMM's Go client writes them for unset structs).
    ``kaniko_params`` has no counterpart: kmm builds with buildah.
    """

    dockerfile_config_map: str
    build_args: tuple[tuple[str, str], ...]
    secrets: tuple[str, ...]
    base_image_registry_tls: buildsign.RegistryTLS | None
    selector: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class SignTarget:
    """How the modules in one kernel's image are signed: the merge of the
    container's and the matching mapping's ``sign``.

    ``unsigned_image`` (expanded for the kernel) is the mapping's when set,
    else the container's; None when neither gives one, which admission
    allows only beside ``build`` (the image just built is signed then; KMM
    ignores ``unsignedImage`` beside ``build`` and so should the operator).
    ``key_secret`` and ``cert_secret`` are the mapping's when set, else the
    container's; ``files_to_sign`` are the container's then the mapping's,
    each once, kernel variables expanded (they stay shell globs).
    """

    unsigned_image: str | None
    unsigned_image_registry_tls: buildsign.RegistryTLS | None
    key_secret: str
    cert_secret: str
    files_to_sign: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Target:
    """What a node with ``kernel`` runs for a Module: the mapping that matched,
    the expanded image and the in-tree modules to remove first; with
    ``build`` or ``sign`` at either level, how the image is made when the
    registry lacks it; and the registry TLS options of ``image`` (the
    mapping's ``registryTLS`` if it sets one, else the container's)."""

    kernel: str
    mapping: moduleloader.KernelMapping
    image: str
    in_tree_modules_to_remove: tuple[str, ...]
    build: BuildTarget | None = None
    sign: SignTarget | None = None
    registry_tls: buildsign.RegistryTLS | None = None


def node_kernel(kernel_version: str) -> str:
    """The kernel KMM matches against: ``nodeInfo.kernelVersion`` minus ONE trailing ``+``."""
    return kernel_version.removesuffix("+")


def tag_safe(kernel: str) -> str:
    """``kernel`` as an image tag may hold it (KMM's ``KERNEL_FULL_VERSION``):
    each character a tag may not hold becomes ``_`` (Debian's
    ``6.12.118+deb12-amd64`` is ``6.12.118_deb12-amd64``). The one form used
    wherever a kernel names an image: mapped images and the sandbox's own."""
    return _UNSAFE.sub("_", kernel)


def find_mapping(
    mappings: list[moduleloader.KernelMapping], kernel: str
) -> moduleloader.KernelMapping | None:
    """The first mapping that matches ``kernel`` (already trimmed), or None."""
    for mapping in mappings:
        if mapping.literal is not None:
            if mapping.literal == kernel:
                return mapping
        elif mapping.regexp is not None and regexps.search(mapping.regexp, kernel):
            return mapping
    return None


def variables(kernel: str, *, module_name: str, module_namespace: str) -> dict[str, str]:
    """The image variables for ``kernel`` (already trimmed) and a Module."""
    parts = _SEPARATORS.split(kernel)
    if len(parts) < 3:
        raise KernelMappingError(
            f"kernel {kernel!r} has fewer than 3 parts separated by '.', ',' or '-'"
        )
    x, y, z = parts[:3]
    return {
        "KERNEL_FULL_VERSION": tag_safe(kernel),
        "KERNEL_XYZ": f"{x}.{y}.{z}",
        "KERNEL_X": x,
        "KERNEL_Y": y,
        "KERNEL_Z": z,
        "MOD_NAME": module_name,
        "MOD_NAMESPACE": module_namespace,
    }


def expand(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``${VAR}`` / ``$VAR`` replaced; unknown names are errors."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) if match.group(1) is not None else match.group(2)
        try:
            return values[name]
        except KeyError:
            raise KernelMappingError(
                f"unknown variable {name!r} in {template!r}; known: {', '.join(sorted(values))}"
            ) from None

    return formats.PLACEHOLDER.sub(replace, template)


def target(module: modules.Module, kernel_version: str) -> Target | None:
    """What a node with ``nodeInfo.kernelVersion`` = ``kernel_version`` runs for ``module``.

    None when the Module has no ``moduleLoader`` or no mapping matches (the
    node is not targeted). Raises ``KernelMappingError`` when the image cannot
    be expanded for this kernel, expands to a name the reference grammar
    refuses (``formats.image_error``: admission judged only its literal
    parts), or to a digest beside build or sign.
    """
    loader = module.spec.module_loader
    if loader is None:
        return None
    kernel = node_kernel(kernel_version)
    container = loader.container
    mapping = find_mapping(container.kernel_mappings, kernel)
    if mapping is None:
        return None
    template = mapping.container_image or container.container_image
    if template is None:  # validation forbids it; kept for objects built unchecked
        raise KernelMappingError(f"kernel mapping for {kernel!r} has no containerImage")
    values = variables(
        kernel,
        module_name=module.metadata.name,
        module_namespace=module.metadata.namespace or "",
    )
    # The mapping's own list wins over the container's, as in KMM; the
    # deprecated singular fields are folded in so callers see one list.
    if mapping.in_tree_modules_to_remove is not None or mapping.in_tree_module_to_remove:
        listed, single = mapping.in_tree_modules_to_remove, mapping.in_tree_module_to_remove
    else:
        listed, single = container.in_tree_modules_to_remove, container.in_tree_module_to_remove
    remove = tuple(listed or ()) + ((single,) if single and single not in (listed or ()) else ())
    image = expand(template, values)
    # Only KERNEL_FULL_VERSION is made tag-safe (as in KMM); KERNEL_Z of
    # "6.8.0+rt" is "0+rt". Refuse the image here, with the kernel named,
    # rather than hand the kubelet a reference it cannot pull.
    invalid = formats.image_error(image)
    if invalid is not None:
        raise KernelMappingError(f"for kernel {kernel!r}: {invalid}")
    build = _build(container.build, mapping.build, kernel)
    sign = _sign(container.sign, mapping.sign, kernel, values)
    if (build is not None or sign is not None) and "@" in image:
        # Admission refuses a digest beside build or sign; a variable can
        # still expand to one (a kernel string is the node's to choose).
        raise KernelMappingError(
            f"for kernel {kernel!r}: image {image!r} names a digest; a build or sign "
            "pushes to a tag"
        )
    if build is None and sign is not None and sign.unsigned_image == image:
        # Written apart, equal once expanded: the unsigned image would pass
        # for the signed one and never be signed.
        raise KernelMappingError(
            f"for kernel {kernel!r}: sign.unsignedImage and containerImage are both {image!r}"
        )
    return Target(
        kernel,
        mapping,
        image,
        remove,
        build=build,
        sign=sign,
        registry_tls=_tls(mapping.registry_tls, container.registry_tls),
    )


def _tls(*levels: buildsign.RegistryTLS | None) -> buildsign.RegistryTLS | None:
    """The first of ``levels`` (the mapping's first) that sets an option."""
    return next((tls for tls in levels if tls is not None and tls.is_set()), None)


def _once(*lists: Iterable[str] | None) -> tuple[str, ...]:
    """The items of ``lists`` in order, each kept the first time it appears."""
    return tuple(dict.fromkeys(item for items in lists for item in items or ()))


def _build(
    container: buildsign.Build | None, mapping: buildsign.Build | None, kernel: str
) -> BuildTarget | None:
    levels = [level for level in (mapping, container) if level is not None]
    if not levels:
        return None
    config_map = next(
        (b.dockerfile_config_map.name for b in levels if b.dockerfile_config_map is not None),
        None,
    )
    if config_map is None:  # validation forbids it; kept for objects built unchecked
        raise KernelMappingError(f"build for kernel {kernel!r} has no dockerfileConfigMap")
    args: dict[str, str] = {}
    for level in (container, mapping):
        for arg in (level.build_args or ()) if level is not None else ():
            args[arg.name] = arg.value
    return BuildTarget(
        dockerfile_config_map=config_map,
        build_args=tuple(args.items()),
        secrets=_once(
            *((s.name for s in level.secrets or ()) for level in (container, mapping) if level)
        ),
        base_image_registry_tls=_tls(*(b.base_image_registry_tls for b in levels)),
        selector=tuple(sorted(next((b.selector for b in levels if b.selector), {}).items())),
    )


def _sign(
    container: buildsign.Sign | None,
    mapping: buildsign.Sign | None,
    kernel: str,
    values: Mapping[str, str],
) -> SignTarget | None:
    levels = [level for level in (mapping, container) if level is not None]
    if not levels:
        return None
    key = next((s.key_secret.name for s in levels if s.key_secret is not None), None)
    cert = next((s.cert_secret.name for s in levels if s.cert_secret is not None), None)
    if key is None or cert is None:  # validation forbids it, as above
        raise KernelMappingError(f"sign for kernel {kernel!r} needs keySecret and certSecret")
    unsigned = next((s.unsigned_image for s in levels if s.unsigned_image is not None), None)
    if unsigned is not None:
        unsigned = expand(unsigned, values)
        invalid = formats.image_error(unsigned)
        if invalid is not None:
            raise KernelMappingError(f"for kernel {kernel!r}: sign.unsignedImage: {invalid}")
    files = [
        path
        for level in (container, mapping)
        if level is not None
        for path in level.files_to_sign or ()
    ]
    # filesToSign are paths in the image, where the build put the modules
    # under the kernel as the build arg KERNEL_FULL_VERSION gives it (Debian's
    # 6.12.118+deb13-amd64), not the tag-safe form an image tag needs
    # (6.12.118_deb13-amd64): a '+' kernel would otherwise match no file.
    paths = {**values, "KERNEL_FULL_VERSION": kernel}
    return SignTarget(
        unsigned_image=unsigned,
        unsigned_image_registry_tls=_tls(*(s.unsigned_image_registry_tls for s in levels)),
        key_secret=key,
        cert_secret=cert,
        files_to_sign=_once(expand(path, paths) for path in files),
    )


@dataclasses.dataclass(frozen=True)
class Grouping:
    """Nodes grouped by what they run (seed 000 step 2: one DaemonSet per pair).

    ``targets`` maps each trimmed kernel to its ``Target``; ``nodes`` maps the
    same kernels to their node names (sorted); ``untargeted`` are nodes no
    mapping matches; ``errors`` maps kernels whose image cannot be expanded
    to the reason (their nodes are in neither list: the Module is Degraded).
    """

    targets: dict[str, Target]
    nodes: dict[str, list[str]]
    untargeted: list[str]
    errors: dict[str, str]

    def pairs(self) -> set[tuple[str, str]]:
        """The (kernel, image) pairs that need a loader DaemonSet."""
        return {(kernel, target.image) for kernel, target in self.targets.items()}


def group_nodes(module: modules.Module, node_kernels: Iterable[tuple[str, str]]) -> Grouping:
    """Group ``(node name, nodeInfo.kernelVersion)`` pairs by the Module's kernel mapping.

    Each distinct kernel is resolved once, however many nodes run it.
    """
    resolved: dict[str, Target | None] = {}
    errors: dict[str, str] = {}
    nodes: dict[str, list[str]] = {}
    untargeted: list[str] = []
    for node, kernel_version in node_kernels:
        kernel = node_kernel(kernel_version)
        if kernel not in resolved and kernel not in errors:
            try:
                resolved[kernel] = target(module, kernel)
            except KernelMappingError as err:
                errors[kernel] = str(err)
        if kernel in errors:
            continue
        if resolved[kernel] is None:
            untargeted.append(node)
        else:
            nodes.setdefault(kernel, []).append(node)
    targets = {k: t for k, t in resolved.items() if t is not None}
    return Grouping(
        targets=targets,
        nodes={k: sorted(v) for k, v in sorted(nodes.items())},
        untargeted=sorted(untargeted),
        errors=errors,
    )
