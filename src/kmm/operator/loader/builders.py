"""Pure builders for module-loader DaemonSets: one per (kernel, image) pair.

The loader pod loads the module in ``postStart`` and unloads it in
``preStop`` (seed 000; DESIGN §5), so the pod is Ready exactly while the
module is loaded. DESIGN §5 keeps KMM's early DaemonSet design and closes its
hole: ``updateStrategy: OnDelete``, and the pod template is a function of the
(kernel, image, modprobe) content and the Module's scheduling fields only, so
an operator upgrade never restarts a loader pod. (One upgrade did change the
template: the main process, ``MAIN_COMMAND``, became a shell that exits on
SIGTERM. The operator then patches each loader DaemonSet once; OnDelete
leaves its running pods as they are, and only pods made afterwards, on new
nodes or in place of deleted ones, run the new command. A second did the
same: the hooks became ``loader.scripts``' scripts, which check what the
kernel holds before and after the load and write why a hook failed to the
container's termination message.)

With ``version`` set (ordered upgrades), a DaemonSet is per (kernel, image,
version): its name and labels carry the version and its pods select the
node label ``version-module-loader`` = that version as well as the kernel.

With ``modulesLoadingOrder`` (KMM's softdep design): the pod carries a
modprobe.d file, ``/etc/modprobe.d/softdep.conf``, making each entry a
``pre:`` softdep of the one before it, so the one ``modprobe <first>`` of
``postStart`` loads the chain from the last entry to the first. The file is
a pod annotation projected by the downward API, so it is in force from the
container's start to its ``preStop``, which removes the chain with one
``modprobe -r`` per entry, first to last (``unload_commands`` says why). A
Module without the field gets no annotation, volume or mount: its template,
hence its pods, unchanged.

A kernel whose image kmm built and found as the Module asks for is pinned
(``digest``, from ``kmm.operator.build.planner``): the container runs
``<image>@<digest>`` and the template carries ``labels.IMAGE_DIGEST``, so an
image built again under the same tag changes the template and reaches the
nodes, never a copy a node cached under the tag (no ``imagePullPolicy`` is
forced on the user's choice: a digest is pulled when the node lacks it).
The DaemonSet's name and labels stay the tag's: it is the same pair. With
``OnDelete`` a running pod keeps its image; the loader planner replaces
only pods that never loaded (``loader.planner``).

Neighbours: ``objects`` (hash, owner), ``podspecs`` (the shared pod-spec
fields), ``loader.scripts`` (the hooks' scripts), ``loader.planner`` (the
planner that wants these), ``kmm.api.labels`` (every name used here).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Final

from kmm.api import kernels, labels, modprobing, moduleloader, modules
from kmm.operator import objects, podspecs
from kmm.operator.loader import scripts as loader_scripts

__all__ = [
    "CONTAINER",
    "MAIN_COMMAND",
    "daemonset",
    "daemonset_name",
    "load_command",
    "load_script",
    "pair_labels",
    "pinned",
    "softdep_config",
    "unload_commands",
]

RawObject = dict[str, Any]

#: The loader pod's one container.
CONTAINER: Final = "module-loader"
# The main process only waits; it is PID 1 of its container, where a signal
# without a handler is ignored: a bare ``sleep infinity`` ignores the
# kubelet's SIGTERM after ``preStop``, so every loader pod deletion waited out
# the whole grace period and ended in SIGKILL (exit 137). The shell's trap
# exits 0 on SIGTERM instead (``wait``, unlike a foreground ``sleep``, lets
# the trap run at once). The hooks already need /bin/sh in the image.
MAIN_COMMAND = ("/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait")
_FIRMWARE_HOST_PATH = "/var/lib/firmware"
# KMM's names: a file of its own in modprobe.d, so the image's configuration stays in force.
_SOFTDEP_VOLUME = "modules-order"
_SOFTDEP_FILE = "softdep.conf"
_SOFTDEP_PATH = "/etc/modprobe.d/" + _SOFTDEP_FILE


def _loader(module: modules.Module) -> moduleloader.ModuleLoaderSpec:
    loader = module.spec.module_loader
    if loader is None:
        raise ValueError("a loader DaemonSet needs spec.moduleLoader")
    return loader


def _raw_args(modprobe: modprobing.ModprobeSpec) -> tuple[list[str], list[str]]:
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


def load_command(modprobe: modprobing.ModprobeSpec) -> list[str]:
    """The load ``postStart`` runs: ``modprobe -v -d <dirName> <module>
    <parameters>`` (or ``rawArgs.load`` verbatim)."""
    name = modprobe.module_name
    if name is None:
        load, _unload = _raw_args(modprobe)
        return ["modprobe", *load]
    extra = list(modprobe.args.load) if modprobe.args and modprobe.args.load else []
    return ["modprobe", "-v", *extra, "-d", modprobe.dir_name, name, *(modprobe.parameters or ())]


def load_script(modprobe: modprobing.ModprobeSpec, target: kernels.Target) -> str:
    """The ``postStart`` script (``loader.scripts``): in-tree modules the
    mapping names removed from the kernel, firmware copied where the kernel
    looks for it, what the kernel holds of the module's files checked before
    the load and after it."""
    firmware = (
        ["cp", "-r", f"{modprobe.firmware_path}/.", _FIRMWARE_HOST_PATH]
        if modprobe.firmware_path
        else None
    )
    name = modprobe.module_name
    return loader_scripts.load_script(
        in_tree=target.in_tree_modules_to_remove or (),
        firmware=firmware,
        load=load_command(modprobe),
        checked=(modprobe.dir_name, name) if name is not None else None,
    )


def unload_commands(modprobe: modprobing.ModprobeSpec) -> list[list[str]]:
    """The commands ``preStop`` runs: ``modprobe -rv -d <dirName> <module>``
    (with ``modulesLoadingOrder``, one for each listed module, in that order)."""
    name = modprobe.module_name
    if name is None:
        _load, unload = _raw_args(modprobe)
        return [["modprobe", *unload]]
    extra = list(modprobe.args.unload) if modprobe.args and modprobe.args.unload else []
    # With modulesLoadingOrder the softdep file is in force here (KMM unloads
    # in a pod without it). kmod's ``modprobe -r <name>`` removes a loaded
    # name and then its ``pre:`` softdeps if unused (recursively); a name not
    # loaded is a success that does nothing, softdeps included (a user's
    # ``--first-time`` in args.unload makes it a failure). So one command
    # per name, first to last, removes whatever is left of the chain from any
    # state (an earlier partial unload, a member already gone), in unload
    # order, and a repeat does nothing. Deliberately not KMM's single
    # ``modprobe -r <all>``: that goes on past a module in use and removes
    # what it needs, and the next loader's ``modprobe <first>`` does nothing
    # for a module already loaded, softdeps included: it would stay without
    # them. The ``&&`` chain stops at the first failure instead.
    names = modprobe.modules_loading_order or [name]
    return [["modprobe", "-rv", *extra, "-d", modprobe.dir_name, entry] for entry in names]


def softdep_config(order: Sequence[str]) -> str:
    """The modprobe.d text KMM writes for ``modulesLoadingOrder``: each entry
    a ``pre:`` softdep of the one before it."""
    return "".join(
        f"softdep {module} pre: {before}\n" for module, before in itertools.pairwise(order)
    )


def _mount_softdep_file(
    template_metadata: RawObject, pod_spec: RawObject, container: RawObject, order: Sequence[str]
) -> None:
    template_metadata["annotations"] = {labels.MODULES_ORDER: softdep_config(order)}
    field = f"metadata.annotations['{labels.MODULES_ORDER}']"
    pod_spec.setdefault("volumes", []).append(
        {
            "name": _SOFTDEP_VOLUME,
            "downwardAPI": {"items": [{"path": _SOFTDEP_FILE, "fieldRef": {"fieldPath": field}}]},
        }
    )
    container.setdefault("volumeMounts", []).append(
        {
            "name": _SOFTDEP_VOLUME,
            "mountPath": _SOFTDEP_PATH,
            "subPath": _SOFTDEP_FILE,
            "readOnly": True,
        }
    )


def _shell(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


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


def pinned(image: str, digest: str | None) -> str:
    """``image`` as a loader runs it: ``<image>@<digest>`` when pinned (the
    tag kept for readers; runtimes pull by the digest)."""
    if not digest:
        return image
    return f"{image.split('@', 1)[0]}@{digest}"


def daemonset(
    module: modules.Module, target: kernels.Target, *, digest: str | None = None
) -> RawObject:
    """The desired loader DaemonSet for one (kernel, image) pair, hash-stamped;
    ``digest``: the image's, when kmm built it (pinned)."""
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
        "name": CONTAINER,
        "image": pinned(target.image, digest),
        # The container only holds the module files; the hooks do the work.
        "command": list(MAIN_COMMAND),
        # modprobe needs root and SYS_MODULE (DESIGN §5), and the firmware
        # copy writes a root-owned host directory; nothing else: the
        # runtime's default capabilities are dropped.
        "securityContext": {
            "capabilities": {"drop": ["ALL"], "add": ["SYS_MODULE"]},
            "runAsUser": 0,
        },
        "lifecycle": {
            "postStart": {"exec": {"command": _shell(load_script(modprobe, target))}},
            "preStop": {
                "exec": {"command": _shell(loader_scripts.unload_script(unload_commands(modprobe)))}
            },
        },
        # A failed hook writes why there (``loader.scripts``); the operator
        # reads it from the container's last termination (``loader.reports``).
        "terminationMessagePath": loader_scripts.REPORT_PATH,
        "terminationMessagePolicy": "File",
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
    template_metadata: RawObject = {"labels": dict(pod_labels)}
    if digest:
        # On the template only: the selector (immutable) stays the pair's.
        template_metadata["labels"][labels.IMAGE_DIGEST] = labels.image_digest_value(digest)
    if modprobe.modules_loading_order:
        _mount_softdep_file(template_metadata, pod_spec, container, modprobe.modules_loading_order)
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
                "template": {"metadata": template_metadata, "spec": pod_spec},
            },
        }
    )
