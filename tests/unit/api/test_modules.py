"""Validation tables: KMM manifests accepted unchanged, each invalid one named."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import mount_cases
import pytest

from kmm.api import examples, labels, modules, validation
from kmm.operator.deviceplugin import builders as deviceplugin_builders
from kmm.operator.dra import builders as dra_builders

Obj = dict[str, Any]


def _loader(obj: Obj) -> Obj:
    container: Obj = obj["spec"]["moduleLoader"]["container"]
    return container


def _dump(module: modules.Module) -> Obj:
    return module.model_dump(mode="json", exclude_unset=True)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(examples.module(), id="example"),
        pytest.param(
            {
                "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
                "kind": "Module",
                "metadata": {"name": "intree", "namespace": "ns"},
                "spec": {
                    "selector": {"a": "b"},
                    "devicePlugin": {"container": {"image": "r/dp@sha256:" + "a" * 64}},
                },
            },
            id="device-plugin-only-digest",
        ),
        pytest.param(
            {
                "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
                "kind": "Module",
                "metadata": {"name": "raw", "namespace": "ns"},
                "spec": {
                    "selector": {},
                    "moduleLoader": {
                        "container": {
                            "modprobe": {"rawArgs": {"load": ["-v", "x"], "unload": ["-rv", "x"]}},
                            "containerImage": "host:5000/r/x:${KERNEL_XYZ}-${MOD_NAMESPACE}",
                            "version": "1.2.3",
                            "kernelMappings": [{"regexp": "^5\\.14\\.(\\d+)-"}],
                        }
                    },
                },
            },
            id="raw-args-fallback-image-version",
        ),
    ],
)
def test_valid_manifests_are_accepted_unchanged(obj: Obj) -> None:
    module = validation.parse_module(copy.deepcopy(obj))
    assert _dump(module) == obj


def test_empty_raw_args_beside_module_name_is_accepted(upstream_style: Obj) -> None:
    """KMM accepts it (its webhook counts only non-empty rawArgs lists); it asks nothing."""
    _loader(upstream_style)["modprobe"]["rawArgs"] = {}
    module = validation.parse_module(copy.deepcopy(upstream_style))
    assert _dump(module) == upstream_style


def test_registry_tls_set_at_both_levels_is_accepted(upstream_style: Obj) -> None:
    """KMM's manifests carry it at both levels; it governs kmm's own registry
    requests and the builder's, so it is taken as written."""
    tls = {"insecure": True, "insecureSkipTLSVerify": True}
    _loader(upstream_style)["registryTLS"] = tls
    _loader(upstream_style)["kernelMappings"][0]["registryTLS"] = tls
    module = validation.parse_module(copy.deepcopy(upstream_style))
    assert _dump(module) == upstream_style


def test_upstream_style_manifest_is_accepted_unchanged(upstream_style: Obj) -> None:
    obj = upstream_style
    module = validation.parse_module(copy.deepcopy(obj))
    assert _dump(module) == obj


def test_defaults_and_python_names(upstream_style: Obj) -> None:
    raw = copy.deepcopy(upstream_style)
    module = validation.parse_module(upstream_style)
    loader = module.spec.module_loader
    assert loader is not None
    assert loader.container.modprobe.dir_name == "/opt"
    assert loader.container.kernel_mappings[2].registry_tls is not None
    del _loader(raw)["modprobe"]["dirName"]
    reparsed = validation.parse_module(raw).spec.module_loader
    assert reparsed is not None
    assert reparsed.container.modprobe.dir_name == "/opt"


def _set(path: str, value: object) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return mutate


_DELETE = object()
_ML = "spec.moduleLoader.container"
_KM = f"{_ML}.kernelMappings"


INVALID: list[tuple[str, Callable[[Obj], None], str, str]] = [
    (
        "literal-and-regexp",
        _set(f"{_KM}.0.regexp", "^6$"),
        "spec.moduleLoader.container.kernelMappings[0]",
        "exactly one of literal and regexp",
    ),
    (
        "neither-literal-nor-regexp",
        _set(f"{_KM}.0.literal", _DELETE),
        "spec.moduleLoader.container.kernelMappings[0]",
        "exactly one of literal and regexp",
    ),
    (
        "regexp-does-not-compile",
        _set(f"{_KM}.1.regexp", "^(6.0"),
        "spec.moduleLoader.container.kernelMappings[1].regexp",
        "error parsing regexp: missing closing ): `^(6.0`",
    ),
    (
        "regexp-lookahead",
        _set(f"{_KM}.1.regexp", "^(?!5).*$"),
        "spec.moduleLoader.container.kernelMappings[1].regexp",
        "error parsing regexp: invalid or unsupported Perl syntax: `(?!`",
    ),
    (
        "regexp-backreference",
        _set(f"{_KM}.1.regexp", r"^(\d)\1$"),
        "spec.moduleLoader.container.kernelMappings[1].regexp",
        "error parsing regexp: invalid escape sequence: `\\1`",
    ),
    (
        "image-without-tag",
        _set(f"{_KM}.0.containerImage", "some.registry/org/my-kmod"),
        "spec.moduleLoader.container.kernelMappings[0].containerImage",
        "explicit tag",
    ),
    (
        "image-port-is-not-a-tag",
        _set(f"{_KM}.0.containerImage", "registry:5000/org/my-kmod"),
        "spec.moduleLoader.container.kernelMappings[0].containerImage",
        "explicit tag",
    ),
    (
        "image-unknown-variable",
        _set(f"{_KM}.0.containerImage", "r/x:${KERNEL_VERSION_TYPO}"),
        "spec.moduleLoader.container.kernelMappings[0].containerImage",
        "unknown variable",
    ),
    (
        "device-plugin-image-without-tag",
        _set("spec.devicePlugin.container.image", "r/dp"),
        "spec.devicePlugin.container.image",
        "explicit tag",
    ),
    (
        "device-plugin-image-variable",
        _set("spec.devicePlugin.container.image", "r/$MOD_NAME:1"),
        "spec.devicePlugin.container.image",
        "may not use variables",
    ),
    (
        "device-plugin-init-image-variable",
        _set("spec.devicePlugin.initContainer.image", "r/init:${KERNEL_FULL_VERSION}"),
        "spec.devicePlugin.initContainer.image",
        "may not use variables",
    ),
    (
        "module-name-missing",
        _set(f"{_ML}.modprobe.moduleName", _DELETE),
        "spec.moduleLoader.container.modprobe",
        "moduleName is required unless rawArgs",
    ),
    (
        "raw-args-load-only",
        _set(f"{_ML}.modprobe", {"rawArgs": {"load": ["-v", "x"]}}),
        "spec.moduleLoader.container.modprobe",
        "rawArgs.load and rawArgs.unload must both be set when moduleName is unset",
    ),
    (
        "raw-args-unload-only",
        _set(f"{_ML}.modprobe", {"rawArgs": {"unload": ["-rv", "x"]}}),
        "spec.moduleLoader.container.modprobe",
        "rawArgs.load and rawArgs.unload must both be set when moduleName is unset",
    ),
    (
        "raw-args-empty",
        _set(f"{_ML}.modprobe", {"rawArgs": {}}),
        "spec.moduleLoader.container.modprobe",
        "rawArgs.load and rawArgs.unload must both be set when moduleName is unset",
    ),
    (
        "raw-args-empty-lists",
        _set(f"{_ML}.modprobe", {"rawArgs": {"load": [], "unload": ["-rv", "x"]}}),
        "spec.moduleLoader.container.modprobe.rawArgs.load",
        "at least 1 item",
    ),
    (
        "args-empty-list",
        _set(f"{_ML}.modprobe.args", {"unload": []}),
        "spec.moduleLoader.container.modprobe.args.unload",
        "at least 1 item",
    ),
    (
        "raw-args-with-module-name",
        _set(f"{_ML}.modprobe.rawArgs", {"load": ["-v", "x"], "unload": ["-rv", "x"]}),
        "spec.moduleLoader.container.modprobe",
        "rawArgs cannot be set when moduleName is set",
    ),
    (
        "raw-args-unload-with-module-name",
        _set(f"{_ML}.modprobe.rawArgs", {"unload": ["-rv", "x"]}),
        "spec.moduleLoader.container.modprobe",
        "rawArgs cannot be set when moduleName is set",
    ),
    (
        "loading-order-too-short",
        _set(f"{_ML}.modprobe.modulesLoadingOrder", ["my-kmod"]),
        "spec.moduleLoader.container.modprobe.modulesLoadingOrder",
        "at least 2",
    ),
    (
        "loading-order-first-is-not-module",
        _set(f"{_ML}.modprobe.modulesLoadingOrder", ["my_dep_a", "my-kmod"]),
        "spec.moduleLoader.container.modprobe",
        "modulesLoadingOrder must start with moduleName",
    ),
    (
        "loading-order-duplicates",
        _set(f"{_ML}.modprobe.modulesLoadingOrder", ["my-kmod", "a", "a"]),
        "spec.moduleLoader.container.modprobe",
        "more than once",
    ),
    (
        "no-kernel-mappings",
        _set(f"{_ML}.kernelMappings", []),
        "spec.moduleLoader.container.kernelMappings",
        "at least 1",
    ),
    (
        "no-image-anywhere",
        _set(f"{_KM}.0.containerImage", _DELETE),
        "spec.moduleLoader.container",
        "need containerImage",
    ),
    (
        "dra-and-device-plugin",
        _set(
            "spec.dra",
            {"driverName": "d.example.com", "container": {"image": "r/d:1"}},
        ),
        "spec",
        "dra and devicePlugin are mutually exclusive",
    ),
    (
        "version-not-a-label-value",
        _set(f"{_ML}.version", "v1+beta"),
        "spec.moduleLoader.container.version",
        "valid label value",
    ),
    (
        "unknown-field",
        _set(f"{_ML}.modprobe.modName", "x"),
        "spec.moduleLoader.container.modprobe.modName",
        "Extra inputs are not permitted",
    ),
    (
        "selector-missing",
        _set("spec.selector", _DELETE),
        "spec.selector",
        "Field required",
    ),
    (
        "name-too-long-for-labels",
        _set("metadata.name", "n" * (labels.MAX_NAME_AND_NAMESPACE - 18)),
        "",
        "metadata.name: namespace and name total",
    ),
]


def _dra_module() -> Obj:
    obj = examples.module()
    return obj


INVALID_DRA: list[tuple[str, Callable[[Obj], None], str, str]] = [
    (
        "dra-image-variable",
        _set("spec.dra.container.image", "r/driver:${KERNEL_XYZ}"),
        "spec.dra.container.image",
        "may not use variables",
    ),
    (
        "dra-init-image-variable",
        _set("spec.dra.initContainer", {"image": "r/${MOD_NAMESPACE}/init:1"}),
        "spec.dra.initContainer.image",
        "may not use variables",
    ),
    (
        "driver-name-not-dns",
        _set("spec.dra.driverName", "Not_DNS"),
        "spec.dra.driverName",
        "DNS subdomain",
    ),
    (
        "device-class-name-not-dns",
        _set("spec.dra.deviceClasses.0.name", "UPPER"),
        "spec.dra.deviceClasses[0].name",
        "DNS subdomain",
    ),
    (
        "driver-name-missing",
        _set("spec.dra.driverName", _DELETE),
        "spec.dra.driverName",
        "Field required",
    ),
    (
        "driver-name-too-long-for-resource-slices",
        _set("spec.dra.driverName", "d" * 60 + ".example.com"),
        "spec.dra.driverName",
        "at most 63",
    ),
    (
        "dra-host-path-etc",
        _set("spec.dra.volumes", [{"name": "etc", "hostPath": {"path": "/etc"}}]),
        "spec.dra.volumes[0].hostPath.path",
        "must be under one of /dev, /sys, /var, /opt, /run",
    ),
    (
        "dra-host-path-root",
        _set("spec.dra.volumes", [{"name": "root", "hostPath": {"path": "/"}}]),
        "spec.dra.volumes[0].hostPath.path",
        "must be under one of",
    ),
    (
        "dra-host-path-lookalike",
        _set("spec.dra.volumes", [{"name": "v", "hostPath": {"path": "/variable"}}]),
        "spec.dra.volumes[0].hostPath.path",
        "must be under one of",
    ),
    (
        "dra-host-path-climbs-out",
        _set("spec.dra.volumes", [{"name": "v", "hostPath": {"path": "/var/../etc"}}]),
        "spec.dra.volumes[0].hostPath.path",
        "'..' component",
    ),
    (
        "dra-volume-name-reserved",
        _set("spec.dra.volumes", [{"name": "cdi", "emptyDir": {}}]),
        "spec.dra.volumes",
        "reserved for the volumes kmm mounts",
    ),
    (
        "device-class-config-without-driver",
        _set("spec.dra.deviceClasses.0.config", [{"opaque": {"parameters": {}}}]),
        "spec.dra.deviceClasses[0].config[0].opaque.driver",
        "Field required",
    ),
    (
        "device-plugin-host-path-etc",
        _set(
            "spec.devicePlugin",
            {
                "container": {"image": "r/dp:1"},
                "volumes": [{"name": "etc", "hostPath": {"path": "/etc/kubernetes"}}],
            },
        ),
        "spec.devicePlugin.volumes[0].hostPath.path",
        "must be under one of",
    ),
]


def test_host_paths_under_the_allowed_roots_and_other_volumes_are_accepted() -> None:
    obj = _dra_module()
    volumes = [
        {"name": "dri", "hostPath": {"path": "/dev/dri", "type": "Directory"}},
        {"name": "state", "hostPath": {"path": "/var/lib/my-driver"}},
        {"name": "sysfs", "hostPath": {"path": "/sys"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    obj["spec"]["dra"]["volumes"] = volumes
    parsed = validation.parse_module(obj)
    assert parsed.spec.dra is not None
    assert [
        v.model_dump(by_alias=True, exclude_none=True) for v in parsed.spec.dra.volumes or ()
    ] == volumes


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [pytest.param(m, p, t, id=i) for i, m, p, t in INVALID],
)
def test_invalid_upstream_module_names_field_and_rule(
    mutate: Callable[[Obj], None], path: str, message: str, upstream_style: Obj
) -> None:
    obj = upstream_style
    mutate(obj)
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in caught.value.violations]
    assert any(p == path and message in m for p, m in found), found


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [pytest.param(m, p, t, id=i) for i, m, p, t in INVALID_DRA],
)
def test_invalid_dra_module_names_field_and_rule(
    mutate: Callable[[Obj], None], path: str, message: str
) -> None:
    obj = _dra_module()
    mutate(obj)
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in caught.value.violations]
    assert any(p == path and message in m for p, m in found), found


def test_error_text_names_the_path(upstream_style: Obj) -> None:
    obj = upstream_style
    _set(f"{_KM}.1.regexp", "(")(obj)
    with pytest.raises(validation.InvalidModuleError, match=r"kernelMappings\[1\]\.regexp: "):
        validation.parse_module(obj)


def test_namespace_is_counted_in_the_name_budget(upstream_style: Obj) -> None:
    obj = upstream_style
    obj["metadata"]["namespace"] = "n" * (labels.MAX_NAME_AND_NAMESPACE - len("my-kmod"))
    validation.parse_module(obj)
    obj["metadata"]["namespace"] += "n"
    with pytest.raises(validation.InvalidModuleError, match=r"metadata\.name"):
        validation.parse_module(obj)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in mount_cases.CASES])
def test_a_mount_of_no_volume_is_refused_naming_field_and_rule(case: Any) -> None:
    """The Python half of the rule; tests/integration/test_module_admission.py
    runs the CEL half on the API server with the same cases."""
    obj = mount_cases.module()
    case.mutate(obj)
    with pytest.raises(validation.InvalidModuleError) as caught:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in caught.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found
    assert "'nowhere'" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "mutate"), mount_cases.ACCEPTED, ids=[n for n, _ in mount_cases.ACCEPTED]
)
def test_a_mount_of_a_declared_or_kmm_volume_is_accepted_and_reaches_the_pod(
    name: str, mutate: Callable[[Obj], None]
) -> None:
    obj = mount_cases.module()
    mutate(obj)
    parsed = validation.parse_module(obj)
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    assert dumped["spec"] == obj["spec"]
    build = dra_builders.daemonset if parsed.spec.dra else deviceplugin_builders.daemonset
    pod = build(parsed)["spec"]["template"]["spec"]
    containers = [*pod["containers"], *pod.get("initContainers", ())]
    mounted = [
        m for c in containers for m in c.get("volumeMounts", ()) if m["mountPath"] == "/mnt/x"
    ]
    # Passed through as written (readOnly included), naming a volume the pod has.
    assert [m["readOnly"] for m in mounted] == [True]
    assert mounted[0]["name"] in {v["name"] for v in pod["volumes"]}
