"""Every label, annotation and finalizer name kmm writes or reads, and their builders.

One module owns them all (a KMM habit): reconcilers never format a label key
themselves, so the 63-character budget computed here (``MAX_NAME_AND_NAMESPACE``)
is the one the validators in :mod:`kmm.api.modules` and the admission policy
in :mod:`kmm.api.admission` enforce.

Label keys are ``prefix/name``; the name part must be at most 63 characters of
``[A-Za-z0-9._-]`` starting and ending alphanumeric. Keys that embed a Module's
namespace and name are the reason a Module's ``namespace`` + ``name`` must be
short: see ``MAX_NAME_AND_NAMESPACE``. Values are made label-safe by
``label_value`` (kernel versions may contain ``+`` or exceed 63 characters).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal

__all__ = [
    "BETA_PREFIX",
    "EVICT_DEVICE_USERS",
    "FINALIZER",
    "IMAGE_BUILD_HASH",
    "IMAGE_DIGEST",
    "IMAGE_HASH",
    "IMAGE_LABELS",
    "IMAGE_REBUILD_TRIGGER",
    "IMAGE_SIGNED",
    "IMAGE_SIGNING_CERT",
    "IMAGE_SIGN_HASH",
    "KERNEL_VERSION_FULL",
    "LAST_HASH",
    "LAST_INPUTS",
    "MAX_LABEL_NAME",
    "MAX_NAME_AND_NAMESPACE",
    "MODULES_ORDER",
    "MODULE_NAME",
    "MODULE_NAMESPACE",
    "MODULE_UID",
    "MODULE_VERSION",
    "PREFIX",
    "PREFLIGHT",
    "PULL_ROLE",
    "REGISTRY_CA",
    "RESOURCE_TYPE",
    "ROLE",
    "SPEC_HASH",
    "TAINTED_NODE",
    "TAINT_KEY",
    "TARGET_KERNEL",
    "Role",
    "daemonset_name",
    "device_plugin_ready",
    "device_plugin_version",
    "dra_ready",
    "dra_target",
    "image_digest_value",
    "image_hash",
    "is_label_key",
    "is_label_value",
    "kernel_value",
    "label_value",
    "module_labels",
    "module_loader_version",
    "module_of_node_label",
    "module_version",
    "node_label_keys",
    "preflight_value",
    "ready",
    "taint_rule_name",
    "taint_value",
    "version_ready",
]

PREFIX: Final = "kmm.node.kubernetes.io/"
BETA_PREFIX: Final = "beta.kmm.node.kubernetes.io/"

# Labels on DaemonSets, pods and DeviceClasses kmm creates: how a reconciler
# finds its own objects again (KMM finds loader DaemonSets by labels, seed 000 step 3).
MODULE_NAME: Final = PREFIX + "module.name"
MODULE_NAMESPACE: Final = PREFIX + "module.namespace"
MODULE_VERSION: Final = PREFIX + "module.version"
# On DeviceClasses (cluster-scoped, so no owner reference can name a
# namespaced Module): the uid of the Module they were made for. A class
# counts as a Module's only when it carries that Module's uid, not merely
# its name and namespace (``kmm.operator.caches``).
MODULE_UID: Final = PREFIX + "module.uid"
ROLE: Final = PREFIX + "role"
IMAGE_HASH: Final = PREFIX + "image-hash"
# On nodes: the node's kernel (label_value of it), so loader DaemonSets can
# select on it; on loader DaemonSets and pods: the kernel they serve.
KERNEL_VERSION_FULL: Final = PREFIX + "kernel-version.full"
# On build and sign pods (KMM's keys): BuildImage or SignImage, and the
# kernel (kernel_value) the image is for.
RESOURCE_TYPE: Final = PREFIX + "resource-type"
TARGET_KERNEL: Final = PREFIX + "target-kernel"
# On preflight pods: the PreflightValidation they answer (preflight_value of
# its name), so its reconciler finds them without reading owner references.
PREFLIGHT: Final = PREFIX + "preflight"

# On pull pods (``kmm.operator.build.pulling``): a node asked whether an
# image exists, where the operator's own registry check cannot tell.
PULL_ROLE: Final = "pull"

# Labels in the *image config* of every image a build or sign pod pushes
# (``kmm.operator.build.images``): what made it, so the operator can tell an
# image that is what a Module asks for from one that merely exists, after a
# restart too. The build sets the first two (and clears the others, which a
# base image could carry); the sign keeps them and sets the last three. An
# image with none of them (empty or absent) was not made by kmm.
IMAGE_BUILD_HASH: Final = PREFIX + "build-hash"
IMAGE_REBUILD_TRIGGER: Final = PREFIX + "rebuild-trigger"
IMAGE_SIGNED: Final = PREFIX + "signed"
IMAGE_SIGNING_CERT: Final = PREFIX + "signing-cert-sha256"
IMAGE_SIGN_HASH: Final = PREFIX + "sign-hash"
IMAGE_LABELS: Final = (
    IMAGE_BUILD_HASH,
    IMAGE_REBUILD_TRIGGER,
    IMAGE_SIGNED,
    IMAGE_SIGNING_CERT,
    IMAGE_SIGN_HASH,
)
# On the pod template of a loader DaemonSet whose image kmm built, pinned by
# digest: the digest (``image_digest_value``), so the planner tells a pod of
# an older image from one of the current without caching pod specs.
IMAGE_DIGEST: Final = PREFIX + "image-digest"

# Annotation with a digest of the desired object, so a reconciler can tell
# "unchanged" without a deep diff of server-defaulted fields.
SPEC_HASH: Final = PREFIX + "spec-hash"
# Annotation on build, sign and preflight pods: the digest of their inputs
# (kmm.operator.build.hashing), so a failed pod is replaced only when they change.
LAST_HASH: Final = PREFIX + "last-hash"
# Beside it: what that digest was made of (JSON: part -> digest or
# resourceVersion), so a replaced pod's Event can say what changed.
LAST_INPUTS: Final = PREFIX + "last-inputs"
# On build, sign and preflight pods: the registry CA bundle the operator was
# given, projected into the containers as a file by the downward API (an
# environment variable holds at most 128 KiB; annotations 256 KiB in all).
REGISTRY_CA: Final = PREFIX + "registry-ca"

FINALIZER: Final = PREFIX + "module-finalizer"

# Annotation on a Module (the API group's, as KMM's own annotations are):
# "true" opts it in to eviction during ordered upgrades: its DeviceTaintRules
# are NoExecute, not NoSchedule (``kmm.operator.upgrade.taints``). An
# annotation keeps KMM's schema, so KMM manifests stay valid both ways.
EVICT_DEVICE_USERS: Final = "kmm.sigs.x-k8s.io/evict-device-users"
# The taint key of the DeviceTaintRules an ordered upgrade writes (value:
# ``taint_value``, the Module), and the annotation on each rule naming the
# node whose devices it taints (node names do not fit a label value).
TAINT_KEY: Final = PREFIX + "upgrade"
TAINTED_NODE: Final = PREFIX + "node"

# On loader pods of a Module with modulesLoadingOrder: the modprobe.d softdep
# lines, projected into the container as a file (KMM's name and design).
MODULES_ORDER: Final = PREFIX + "modules-order"

Role = Literal["module-loader", "device-plugin", "dra"]

MAX_LABEL_NAME: Final = 63

# Per-module label name parts: (text before "<ns>.<name>", text after).
_PER_MODULE_PARTS: Final = (
    ("", ".ready"),
    ("", ".dra-target"),
    ("", ".device-plugin-ready"),
    ("", ".dra-ready"),
    ("", ".version.ready"),
    ("version-module.", ""),
    ("version-module-loader.", ""),
    ("version-device-plugin.", ""),
)
# Of those, the ones written under PREFIX that end in a suffix (parsed back
# by ``module_of_node_label``); ".version.ready" before ".ready".
_SUFFIXES: Final = (".version.ready", ".ready", ".dra-target", ".device-plugin-ready", ".dra-ready")
# The longest derived label name decides the budget; "." joins ns and name.
MAX_NAME_AND_NAMESPACE: Final = (
    MAX_LABEL_NAME - 1 - max(len(a) + len(b) for a, b in _PER_MODULE_PARTS)
)

_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_UNSAFE_VALUE_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def _module_key(prefix: str, before: str, namespace: str, name: str, after: str) -> str:
    return f"{prefix}{before}{namespace}.{name}{after}"


def ready(namespace: str, name: str) -> str:
    """Node label: the module is loaded on this node (loader pod Ready)."""
    return _module_key(PREFIX, "", namespace, name, ".ready")


def dra_target(namespace: str, name: str) -> str:
    """Node label: the node is a DRA target of the module (seed 000, DRA point 1)."""
    return _module_key(PREFIX, "", namespace, name, ".dra-target")


def device_plugin_ready(namespace: str, name: str) -> str:
    """Node label: the module's device-plugin pod on this node is Ready."""
    return _module_key(PREFIX, "", namespace, name, ".device-plugin-ready")


def dra_ready(namespace: str, name: str) -> str:
    """Node label: the module's DRA driver pod on this node is Ready."""
    return _module_key(PREFIX, "", namespace, name, ".dra-ready")


def version_ready(namespace: str, name: str) -> str:
    """Node label: the version of the module loaded here, once it is (and its
    device plugin Ready, when there is one): an upgrade's "this node is done"."""
    return _module_key(PREFIX, "", namespace, name, ".version.ready")


def module_version(namespace: str, name: str) -> str:
    """Node label the *user* sets to the version the node should run (seed 003)."""
    return _module_key(PREFIX, "version-module.", namespace, name, "")


def module_loader_version(namespace: str, name: str) -> str:
    """Node label the operator sets to gate the versioned loader DaemonSet."""
    return _module_key(BETA_PREFIX, "version-module-loader.", namespace, name, "")


def device_plugin_version(namespace: str, name: str) -> str:
    """Node label the operator sets to gate versioned device-plugin *and* DRA DaemonSets."""
    return _module_key(BETA_PREFIX, "version-device-plugin.", namespace, name, "")


def node_label_keys(namespace: str, name: str) -> tuple[str, ...]:
    """Every per-module node label key, e.g. for cleanup when a Module goes."""
    return (
        ready(namespace, name),
        dra_target(namespace, name),
        device_plugin_ready(namespace, name),
        dra_ready(namespace, name),
        version_ready(namespace, name),
        module_version(namespace, name),
        module_loader_version(namespace, name),
        device_plugin_version(namespace, name),
    )


def module_of_node_label(key: str) -> tuple[str, str] | None:
    """(namespace, name) of the Module a node label key belongs to, or None.

    Every per-module key: the state labels (``<ns>.<name>.ready`` ...), the
    user's ``version-module.<ns>.<name>`` and the operator's version labels.
    A namespace has no dots (a DNS label), so the first dot ends it.
    """
    if key.startswith(BETA_PREFIX):
        part = key[len(BETA_PREFIX) :]
        for before in ("version-module-loader.", "version-device-plugin."):
            if part.startswith(before):
                return _split(part[len(before) :])
        return None
    if not key.startswith(PREFIX):
        return None
    part = key[len(PREFIX) :]
    if part.startswith("version-module."):
        return _split(part[len("version-module.") :])
    for suffix in _SUFFIXES:
        if part.endswith(suffix):
            return _split(part[: -len(suffix)])
    return None


def _split(text: str) -> tuple[str, str] | None:
    namespace, dot, name = text.partition(".")
    return (namespace, name) if dot and namespace and name else None


def module_labels(namespace: str, name: str, role: Role) -> dict[str, str]:
    """The labels that identify an object kmm made for a Module in a given role."""
    return {MODULE_NAME: name, MODULE_NAMESPACE: namespace, ROLE: role}


def is_label_key(key: str) -> bool:
    """Whether ``key`` is a valid qualified label key (optional DNS prefix + name part)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= MAX_LABEL_NAME and bool(_NAME_PART.match(name))


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid label value (empty allowed)."""
    return value == "" or (len(value) <= MAX_LABEL_NAME and bool(_NAME_PART.match(value)))


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_value(text: str) -> str:
    """A valid label value that stands for ``text``, deterministically.

    Unchanged when already valid. Otherwise characters outside
    ``[A-Za-z0-9._-]`` become ``_`` and, when that is still not a valid value
    (too long, or a non-alphanumeric end), the value is cut and suffixed with a
    digest of the original so distinct inputs stay distinct.
    """
    if is_label_value(text):
        return text
    safe = _UNSAFE_VALUE_CHARS.sub("_", text)
    if is_label_value(safe):
        return safe
    head = safe[: MAX_LABEL_NAME - 11].strip("._-")
    return f"{head}-{_digest(text, 10)}" if head else _digest(text, 10)


def kernel_value(kernel: str) -> str:
    """The ``KERNEL_VERSION_FULL`` label value for a (trimmed) kernel, on nodes
    and on loader DaemonSets alike, so a DaemonSet's selector always matches."""
    return label_value(kernel)


def preflight_value(name: str) -> str:
    """The ``PREFLIGHT`` label value for a PreflightValidation's name: the name
    itself when it fits (at most 63 characters), else cut with a digest."""
    return label_value(name)


def image_hash(image: str) -> str:
    """Label value standing for a container image (images exceed 63 characters)."""
    return _digest(image, 16)


def image_digest_value(digest: str) -> str:
    """The ``IMAGE_DIGEST`` label value of a manifest digest (``sha256:<hex>``):
    its first 32 hex digits (a label value holds 63 characters, the digest 71)."""
    return digest.removeprefix("sha256:")[:32]


def daemonset_name(name: str, role: Role, *parts: str) -> str:
    """A DaemonSet name of at most 63 characters, unique per (Module, role, parts).

    ``parts`` are what makes DaemonSets of one role distinct: the kernel for a
    loader, the version when ordered upgrades are on. The Module name is kept
    readable and cut when needed; the digest keeps names unique.
    """
    short = {"module-loader": "loader", "device-plugin": "device-plugin", "dra": "dra"}[role]
    digest = _digest("\x00".join((name, role, *parts)), 10)
    budget = MAX_LABEL_NAME - len(short) - len(digest) - 2
    head = name[:budget].rstrip(".-")
    return f"{head}-{short}-{digest}"


def taint_value(namespace: str, name: str) -> str:
    """The ``TAINT_KEY`` value of a Module's DeviceTaintRules: ``<ns>.<name>``
    (it fits: ``MAX_NAME_AND_NAMESPACE``)."""
    return label_value(f"{namespace}.{name}")


_MAX_OBJECT_NAME: Final = 253
_NOT_SUBDOMAIN = re.compile(r"[^a-z0-9.-]")


def taint_rule_name(
    namespace: str, name: str, *, uid: str, node: str, driver: str, pool: str, device: str = ""
) -> str:
    """A DeviceTaintRule name (a DNS subdomain of at most 253 characters),
    one per (Module, its uid, node, driver, pool, device): the Module and the
    node readable, cut when too long; the digest keeps names distinct (an
    earlier Module of the same name, with another uid, never shares one)."""
    digest = _digest("\x00".join((namespace, name, uid, node, driver, pool, device)), 12)
    readable = _NOT_SUBDOMAIN.sub("-", f"kmm.{namespace}.{name}.{node}".lower())
    head = readable[: _MAX_OBJECT_NAME - len(digest) - 1].rstrip(".-")
    found = f"{head}-{digest}"
    return found if _DNS_SUBDOMAIN.match(found) else f"kmm-{digest}"
