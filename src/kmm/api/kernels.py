"""Kernel mapping (DESIGN §3): which image, if any, a node's kernel gets.

Facts from KMM: the node's kernel is ``status.nodeInfo.kernelVersion`` with one
trailing ``+`` trimmed; mappings are tried in order and the first match wins;
``literal`` is exact, ``regexp`` an unanchored search (users write ``^…$``);
no match means the node is not targeted. Images expand ``${VAR}`` and ``$VAR``
with the variables of ``variables``; an unknown variable is an error here
rather than KMM's silent empty string, so a typo cannot produce a wrong image.

Regexps run on RE2 (:mod:`kmm.api.regexps`), linear in the kernel string,
exactly as KMM's Go ``regexp`` matches them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from kmm.api import formats, modules, regexps

__all__ = [
    "VARIABLES",
    "Grouping",
    "KernelMappingError",
    "Target",
    "expand",
    "find_mapping",
    "group_nodes",
    "node_kernel",
    "target",
    "variables",
]

VARIABLES = formats.IMAGE_VARIABLES

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SEPARATORS = re.compile(r"[.,-]")


class KernelMappingError(ValueError):
    """A kernel or image that cannot be resolved (e.g. fewer than 3 version parts)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What a node with ``kernel`` runs for a Module: the mapping that matched,
    the expanded image and the in-tree modules to remove first."""

    kernel: str
    mapping: modules.KernelMapping
    image: str
    in_tree_modules_to_remove: tuple[str, ...]


def node_kernel(kernel_version: str) -> str:
    """The kernel KMM matches against: ``nodeInfo.kernelVersion`` minus ONE trailing ``+``."""
    return kernel_version.removesuffix("+")


def find_mapping(
    mappings: list[modules.KernelMapping], kernel: str
) -> modules.KernelMapping | None:
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
        "KERNEL_FULL_VERSION": _UNSAFE.sub("_", kernel),
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
    be expanded for this kernel or expands to an invalid reference.
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
    return Target(kernel, mapping, image, remove)


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
