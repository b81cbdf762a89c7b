"""Pure builders for module-loader DaemonSets: one per (kernel, image) pair.

The loader pod loads the module in ``postStart`` and unloads it in
``preStop`` (seed 000; DESIGN §5), so the pod is Ready exactly while the
module is loaded. DESIGN §5 keeps KMM's early DaemonSet design and closes its
hole: ``updateStrategy: OnDelete``, and the pod template is a function of the
(kernel, image, modprobe) content and the Module's scheduling fields only, so
an operator upgrade never changes it and never restarts a loader pod.

With ``version`` set (ordered upgrades), a DaemonSet is per (kernel, image,
version): its name and labels carry the version and its pods select the
node label ``version-module-loader`` = that version as well as the kernel.

Neighbours: ``objects`` (hash, owner), ``podspecs`` (the shared pod-spec
fields), ``moduleloader`` (the planner that wants these), ``kmm.api.labels``
(every name used here).
"""

from __future__ import annotations

import shlex
from typing import Any

from kmm.api import kernels, labels, modules
from kmm.operator import objects, podspecs

__all__ = ["daemonset", "daemonset_name", "load_commands", "pair_labels", "unload_commands"]

RawObject = dict[str, Any]

_CONTAINER = "module-loader"
_FIRMWARE_HOST_PATH = "/var/lib/firmware"


def _loader(module: modules.Module) -> modules.ModuleLoaderSpec:
    loader = module.spec.module_loader
    if loader is None:
        raise ValueError("a loader DaemonSet needs spec.moduleLoader")
    return loader


def _raw_args(modprobe: modules.ModprobeSpec) -> tuple[list[str], list[str]]:
    """``rawArgs`` (load, unload), for a spec without ``moduleName``.

    Validation guarantees both lists; this checks again with an error, not an
    ``assert`` (gone under ``python -O``), so a model that bypassed validation
    cannot yield a bare ``modprobe``.
    """
    raw = modprobe.raw_args
    if raw is None or not raw.load or not raw.unload:
        raise ValueError(
            "spec.moduleLoader.container.modprobe: without moduleName, "
            "rawArgs.load and rawArgs.unload must both be set"
        )
    return raw.load, raw.unload


def load_commands(modprobe: modules.ModprobeSpec, target: kernels.Target) -> list[list[str]]:
    """The commands ``postStart`` runs, in order.

    In-tree modules the mapping names are removed first; firmware is copied
    where the kernel looks for it; then ``modprobe -v -d <dirName> <module>
    <parameters>`` (or ``rawArgs.load`` verbatim).
    """
    commands: list[list[str]] = []
    if target.in_tree_modules_to_remove:
        commands.append(["modprobe", "-rva", *target.in_tree_modules_to_remove])
    if modprobe.firmware_path:
        commands.append(["cp", "-r", f"{modprobe.firmware_path}/.", _FIRMWARE_HOST_PATH])
    name = modprobe.module_name
    if name is None:
        load, _unload = _raw_args(modprobe)
        commands.append(["modprobe", *load])
        return commands
    extra = list(modprobe.args.load) if modprobe.args and modprobe.args.load else []
    commands.append(
        [
            "modprobe",
            "-v",
            *extra,
            "-d",
            modprobe.dir_name,
            name,
            *(modprobe.parameters or ()),
        ]
    )
    return commands


def unload_commands(modprobe: modules.ModprobeSpec) -> list[list[str]]:
    """The commands ``preStop`` runs: ``modprobe -rv -d <dirName> <module>``
    (with ``modulesLoadingOrder``, every listed module, in that order)."""
    name = modprobe.module_name
    if name is None:
        _load, unload = _raw_args(modprobe)
        return [["modprobe", *unload]]
    extra = list(modprobe.args.unload) if modprobe.args and modprobe.args.unload else []
    names = modprobe.modules_loading_order or [name]
    return [["modprobe", "-rv", *extra, "-d", modprobe.dir_name, *names]]


def _shell(commands: list[list[str]]) -> list[str]:
    return ["/bin/sh", "-c", " && ".join(shlex.join(command) for command in commands)]


def _version(module: modules.Module) -> str | None:
    loader = module.spec.module_loader
    return loader.container.version if loader is not None else None


def pair_labels(module: modules.Module, kernel: str, image: str) -> dict[str, str]:
    """The labels a loader DaemonSet and its pods carry: how the pair is found again."""
    found = {
        **labels.module_labels(
            module.metadata.namespace or "", module.metadata.name, "module-loader"
        ),
        labels.KERNEL_VERSION_FULL: labels.kernel_value(kernel),
        labels.IMAGE_HASH: labels.image_hash(image),
    }
    version = _version(module)
    if version is not None:
        found[labels.MODULE_VERSION] = version
    return found


def daemonset_name(module: modules.Module, kernel: str, image: str) -> str:
    """Deterministic per pair (and version), so a create repeated after a crash cannot duplicate."""
    version = _version(module)
    parts = (kernel, image) if version is None else (kernel, image, version)
    return labels.daemonset_name(module.metadata.name, "module-loader", *parts)


def daemonset(module: modules.Module, target: kernels.Target) -> RawObject:
    """The desired loader DaemonSet for one (kernel, image) pair, hash-stamped."""
    loader = _loader(module)
    modprobe = loader.container.modprobe
    container_spec = loader.container
    pod_labels = pair_labels(module, target.kernel, target.image)
    node_selector = {
        **module.spec.selector,
        labels.KERNEL_VERSION_FULL: labels.kernel_value(target.kernel),
    }
    version = _version(module)
    if version is not None:
        namespace = module.metadata.namespace or ""
        node_selector[labels.module_loader_version(namespace, module.metadata.name)] = version
    container: RawObject = {
        "name": _CONTAINER,
        "image": target.image,
        # The container only holds the module files; the hooks do the work.
        "command": ["sleep", "infinity"],
        # modprobe needs root and SYS_MODULE (DESIGN §5), and the firmware
        # copy writes a root-owned host directory; nothing else: the
        # runtime's default capabilities are dropped.
        "securityContext": {
            "capabilities": {"drop": ["ALL"], "add": ["SYS_MODULE"]},
            "runAsUser": 0,
        },
        "lifecycle": {
            "postStart": {"exec": {"command": _shell(load_commands(modprobe, target))}},
            "preStop": {"exec": {"command": _shell(unload_commands(modprobe))}},
        },
    }
    if container_spec.image_pull_policy is not None:
        container["imagePullPolicy"] = container_spec.image_pull_policy
    pod_spec: RawObject = {
        **podspecs.base(module, service_account=loader.service_account_name),
        "containers": [container],
        "nodeSelector": node_selector,
    }
    if modprobe.firmware_path:
        container["volumeMounts"] = [{"name": "firmware", "mountPath": _FIRMWARE_HOST_PATH}]
        pod_spec["volumes"] = [
            {
                "name": "firmware",
                "hostPath": {"path": "/lib/firmware", "type": "DirectoryOrCreate"},
            }
        ]
    return objects.stamped(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": daemonset_name(module, target.kernel, target.image),
                "namespace": module.metadata.namespace,
                "labels": dict(pod_labels),
                "ownerReferences": [objects.controller_reference(module)],
            },
            "spec": {
                "selector": {"matchLabels": dict(pod_labels)},
                "updateStrategy": {"type": "OnDelete"},
                "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod_spec},
            },
        }
    )
