"""Module admission on a real apiserver: the CRD rules and the admission policy.

Each invalid Module is refused with a message naming the field; a refused
Module creates nothing. ``install`` and ``refusal`` take a plain
kubernetes-asyncio client, so they can be driven against any apiserver.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import build_sign_cases
import image_cases
import mount_cases
import pytest
import regexp_cases as cases
import yaml
from kubernetes_asyncio import client

from kmm.api import admission, crd, examples, labels, modules, regexps, validation

Obj = dict[str, Any]


async def _create_or_replace(
    create: Callable[..., Any], read: Callable[..., Any], replace: Callable[..., Any], body: Obj
) -> None:
    name = body["metadata"]["name"]
    try:
        await create(body=body)
    except client.ApiException as err:
        if err.status != 409:
            raise
        current = await read(name)
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        await replace(name, body=body)


async def install(api: client.ApiClient) -> None:
    """Apply the CRD and the admission policy; wait until both take effect."""
    extensions = client.ApiextensionsV1Api(api)
    await _create_or_replace(
        extensions.create_custom_resource_definition,
        extensions.read_custom_resource_definition,
        extensions.replace_custom_resource_definition,
        crd.render(),
    )
    registration = client.AdmissionregistrationV1Api(api)
    for obj in admission.render():
        if obj["kind"] == "ValidatingAdmissionPolicy":
            await _create_or_replace(
                registration.create_validating_admission_policy,
                registration.read_validating_admission_policy,
                registration.replace_validating_admission_policy,
                obj,
            )
        else:
            await _create_or_replace(
                registration.create_validating_admission_policy_binding,
                registration.read_validating_admission_policy_binding,
                registration.replace_validating_admission_policy_binding,
                obj,
            )
    # The CRD serves once Established; the policy bites once its informer has
    # it. Probe with a Module only the policy refuses.
    too_long = "n" * labels.MAX_NAME_AND_NAMESPACE
    for _ in range(120):
        if await refusal(api, "default", examples.module(name=too_long)) is not None:
            return
        await asyncio.sleep(0.5)
    raise AssertionError("the Module CRD or admission policy never took effect")


async def refusal(api: client.ApiClient, namespace: str, obj: Obj) -> str | None:
    """The apiserver's message refusing ``obj`` (dry run), or None if accepted."""
    objects = client.CustomObjectsApi(api)
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = namespace
    try:
        await objects.create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body, dry_run="All"
        )
    except client.ApiException as err:
        if err.status == 404:  # CRD not served yet
            return None
        message: str = json.loads(err.body)["message"]
        return message
    return None


async def create_with_warnings(
    api: client.ApiClient, namespace: str, obj: Obj, *, dry_run: bool = False
) -> list[str]:
    """Create ``obj``; the Warning headers of the apiserver's answer."""
    body = copy.deepcopy(obj)
    body["metadata"]["namespace"] = namespace
    _stored, _status, headers = await client.CustomObjectsApi(
        api
    ).create_namespaced_custom_object_with_http_info(
        modules.GROUP,
        modules.VERSION,
        namespace,
        modules.PLURAL,
        body,
        **({"dry_run": "All"} if dry_run else {}),
    )
    found: list[str] = headers.getall("Warning", [])
    return found


def _mappings(obj: Obj) -> list[Obj]:
    found: list[Obj] = obj["spec"]["moduleLoader"]["container"]["kernelMappings"]
    return found


def _regexp(value: str) -> Callable[[Obj], None]:
    return lambda obj: _mappings(obj)[1].__setitem__("regexp", value)


def _modprobe(value: Obj) -> Callable[[Obj], None]:
    return lambda obj: obj["spec"]["moduleLoader"]["container"].__setitem__("modprobe", value)


def _dra_image(field: str, image: str) -> Callable[[Obj], None]:
    return lambda obj: obj["spec"]["dra"].__setitem__(field, {"image": image})


_BOTH_RAW_ARGS = ("modprobe.rawArgs", "rawArgs.load and rawArgs.unload must both be set")


CASES: list[tuple[str, Callable[[Obj], None], tuple[str, ...]]] = [
    ("regexp-does-not-compile", _regexp("^(6.0"), ("kernelMappings[1].regexp", "RE2")),
    (
        "image-without-tag",
        lambda obj: _mappings(obj)[0].__setitem__("containerImage", "quay.io/example/x"),
        ("kernelMappings[0].containerImage", "explicit tag"),
    ),
    (
        "literal-and-regexp",
        lambda obj: _mappings(obj)[0].__setitem__("regexp", "^6$"),
        ("kernelMappings[0]", "exactly one of literal and regexp"),
    ),
    (
        "name-too-long",
        lambda obj: obj["metadata"].__setitem__("name", "n" * labels.MAX_NAME_AND_NAMESPACE),
        ("metadata.name", "at most"),
    ),
    (
        "dra-and-device-plugin",
        lambda obj: obj["spec"].__setitem__("devicePlugin", {"container": {"image": "r/x:1"}}),
        ("spec.dra", "mutually exclusive"),
    ),
    (
        "dra-host-path-etc",
        lambda obj: obj["spec"]["dra"].__setitem__(
            "volumes", [{"name": "etc", "hostPath": {"path": "/etc"}}]
        ),
        ("spec.dra.volumes[0].hostPath.path", "/dev, /sys, /var, /opt, /run"),
    ),
    (
        "dra-host-path-climbs-out",
        lambda obj: obj["spec"]["dra"].__setitem__(
            "volumes", [{"name": "v", "hostPath": {"path": "/run/../etc"}}]
        ),
        ("spec.dra.volumes[0].hostPath.path", "'..'"),
    ),
    (
        "device-plugin-host-path-root",
        lambda obj: obj["spec"].update(
            dra=None,
            devicePlugin={
                "container": {"image": "r/x:1"},
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            },
        ),
        ("spec.devicePlugin.volumes[0].hostPath.path", "/dev, /sys, /var, /opt, /run"),
    ),
    ("raw-args-load-only", _modprobe({"rawArgs": {"load": ["-v", "x"]}}), _BOTH_RAW_ARGS),
    ("raw-args-unload-only", _modprobe({"rawArgs": {"unload": ["-rv", "x"]}}), _BOTH_RAW_ARGS),
    ("raw-args-empty", _modprobe({"rawArgs": {}}), _BOTH_RAW_ARGS),
    (
        "raw-args-empty-list",
        _modprobe({"rawArgs": {"load": [], "unload": ["-rv", "x"]}}),
        ("modprobe.rawArgs.load", "at least 1 item"),
    ),
    (
        "raw-args-with-module-name",
        _modprobe({"moduleName": "x", "rawArgs": {"load": ["x"], "unload": ["-r", "x"]}}),
        ("modprobe.rawArgs", "rawArgs cannot be set when moduleName is set"),
    ),
    (
        "dra-image-variable",
        _dra_image("container", "r/driver:${KERNEL_FULL_VERSION}"),
        ("spec.dra.container.image", "may not use variables"),
    ),
    (
        "dra-init-image-variable",
        _dra_image("initContainer", "r/$MOD_NAME:1"),
        ("spec.dra.initContainer.image", "may not use variables"),
    ),
    (
        "device-plugin-image-variable",
        lambda obj: obj["spec"].update(
            dra=None, devicePlugin={"container": {"image": "r/${MOD_NAMESPACE}:1"}}
        ),
        ("spec.devicePlugin.container.image", "may not use variables"),
    ),
    (
        "device-plugin-init-image-variable",
        lambda obj: obj["spec"].update(
            dra=None,
            devicePlugin={
                "container": {"image": "r/plugin:1"},
                "initContainer": {"image": "r/init:$KERNEL_XYZ"},
            },
        ),
        ("spec.devicePlugin.initContainer.image", "may not use variables"),
    ),
    (
        "dra-volume-name-reserved",
        lambda obj: obj["spec"]["dra"].__setitem__("volumes", [{"name": "cdi", "emptyDir": {}}]),
        ("spec.dra.volumes", "reserved"),
    ),
]


@pytest.mark.parametrize(("mutate", "fragments"), [pytest.param(m, f, id=i) for i, m, f in CASES])
async def test_invalid_module_is_refused_naming_the_field(
    api_client: client.ApiClient,
    namespace: str,
    mutate: Callable[[Obj], None],
    fragments: tuple[str, ...],
) -> None:
    await install(api_client)
    obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    mutate(obj)
    message = await refusal(api_client, namespace, obj)
    assert message is not None, "accepted"
    for fragment in fragments:
        assert fragment in message, message
    listed = await client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL
    )
    assert listed["items"] == []


async def test_example_module_is_stored_unchanged(
    api_client: client.ApiClient, namespace: str
) -> None:
    await install(api_client)
    obj = examples.module()
    obj["metadata"]["namespace"] = namespace
    objects = client.CustomObjectsApi(api_client)
    stored = await objects.create_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj
    )
    assert stored["spec"] == obj["spec"]


async def _warnings_flow(api: client.ApiClient, namespace: str, obj: Obj) -> None:
    """Wait until the warnings policy answers for ``obj`` (install waited for
    the refusing policy only; the apiserver's policy informer may lag)."""
    for _ in range(120):
        if await create_with_warnings(api, namespace, obj, dry_run=True):
            return
        await asyncio.sleep(0.5)
    raise AssertionError("the warnings policy never took effect")


def _build_sign_module() -> Obj:
    obj = build_sign_cases.module()
    obj["metadata"]["name"] = f"m-{uuid.uuid4().hex[:6]}"
    return obj


async def test_kmm_build_and_sign_manifest_is_stored_unchanged_warning_of_kaniko_only(
    api_client: client.ApiClient, namespace: str
) -> None:
    """KMM's build-and-sign shape (kanikoParams, registryTLS, build and sign
    at both levels) applies; the only warnings name kanikoParams: registryTLS
    now governs kmm's own registry requests and the builder's."""
    await install(api_client)
    obj = _build_sign_module()
    build_sign_cases.mapping(obj, 0)["build"]["kanikoParams"] = {"tag": "debug"}
    build_sign_cases.mapping(obj, 0)["registryTLS"] = {"insecureSkipTLSVerify": True}
    await _warnings_flow(api_client, namespace, obj)
    found = await create_with_warnings(api_client, namespace, obj)
    # A Warning header: '299 - "Validation failed for ...: <message>"'.
    assert sorted(w.split("': ", 1)[1].rstrip('"') for w in found) == [
        "spec.moduleLoader.container.build.kanikoParams has no effect in kmm: "
        "kmm builds with buildah, not kaniko",
        "spec.moduleLoader.container.kernelMappings[].build.kanikoParams has no effect in kmm: "
        "kmm builds with buildah, not kaniko",
    ], found
    stored = await _stored_as_sent(api_client, namespace, obj)
    # The operator's own validation (DESIGN §3: it repeats admission) takes it too.
    validation.parse_module(stored)
    # KMM ignores unsignedImage beside build; kmm does too, and says so.
    build_sign_cases.container(obj)["sign"]["unsignedImage"] = "r/kmod:unsigned"
    obj["metadata"]["name"] += "-u"
    found = await create_with_warnings(api_client, namespace, obj, dry_run=True)
    assert len(found) == 3, found
    assert any("': spec.moduleLoader.container.sign.unsignedImage and " in w for w in found)
    # KMM ignores parameters and args beside rawArgs; kmm does too, and says so.
    raw = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _modprobe({"rawArgs": {"load": ["x"], "unload": ["-r", "x"]}, "parameters": ["a=1"]})(raw)
    [ignored] = await create_with_warnings(api_client, namespace, raw, dry_run=True)
    assert "spec.moduleLoader.container.modprobe.parameters" in ignored, ignored
    assert "have no effect with rawArgs" in ignored, ignored


async def test_upstreams_dra_module_is_stored_unchanged_warning_of_kaniko_only(
    api_client: client.ApiClient, namespace: str
) -> None:
    """Upstream KMM's only DRA example (v1beta1, a build with kanikoParams,
    a DRA driver and its DeviceClass) applies as its CI applies it; the
    one warning names kanikoParams."""
    await install(api_client)
    [obj] = yaml.safe_load_all((Path(__file__).parent / "upstream" / "module-kmm-ci-dra.yaml").read_text())  # fmt: skip
    obj["metadata"]["name"] += f"-{uuid.uuid4().hex[:6]}"
    await _warnings_flow(api_client, namespace, obj)
    found = await create_with_warnings(api_client, namespace, obj)
    assert [w.split("': ", 1)[1].rstrip('"') for w in found] == [
        "spec.moduleLoader.container.kernelMappings[].build.kanikoParams has no effect in kmm: "
        "kmm builds with buildah, not kaniko",
    ], found
    stored = await _stored_as_sent(api_client, namespace, obj)
    parsed = validation.parse_module(stored)
    assert parsed.spec.dra is not None
    assert parsed.spec.dra.driver_name == "gpu.example.com"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in build_sign_cases.CASES])
async def test_build_and_sign_rules_refuse_as_the_operator_does(
    api_client: client.ApiClient, namespace: str, case: build_sign_cases.Case
) -> None:
    """Each build/sign rule in CEL (the API server) and in Python (the
    operator's validation) refuses the same Module, naming the same field
    and rule."""
    await install(api_client)
    obj = _build_sign_module()
    assert await refusal(api_client, namespace, obj) is None
    case.mutate(obj)
    message = await refusal(api_client, namespace, obj)
    assert message is not None, "admitted"
    assert f"{case.field}: " in message, message
    assert (case.cel_message or case.message) in message, message
    with pytest.raises(validation.InvalidModuleError) as refused:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in refused.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in mount_cases.CASES])
async def test_mount_rules_refuse_as_the_operator_does(
    api_client: client.ApiClient, namespace: str, case: build_sign_cases.Case
) -> None:
    """A volumeMounts entry naming no volume: refused by CEL (the API server)
    and by Python (the operator's validation), naming the same field and rule;
    a mount of a declared volume, or of one kmm mounts, is admitted."""
    await install(api_client)
    for _name, accept in mount_cases.ACCEPTED:
        admitted = mount_cases.module()
        accept(admitted)
        assert await refusal(api_client, namespace, admitted) is None
    obj = mount_cases.module()
    case.mutate(obj)
    message = await refusal(api_client, namespace, obj)
    assert message is not None, "admitted"
    assert f"{case.field}: " in message, message
    assert (case.cel_message or case.message) in message, message
    with pytest.raises(validation.InvalidModuleError) as refused:
        validation.parse_module(obj)
    found = [(v.path, v.message) for v in refused.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found


async def test_status_images_and_rebuild_generation_are_kept(
    api_client: client.ApiClient, namespace: str
) -> None:
    """The status schema carries kmm's images list and KMM's
    imageRebuildTriggerGeneration: written through /status, read back whole."""
    await install(api_client)
    obj = _build_sign_module()
    obj["metadata"]["namespace"] = namespace
    objects = client.CustomObjectsApi(api_client)
    stored = await objects.create_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj
    )
    status = {
        "imageRebuildTriggerGeneration": 3,
        "images": [
            {"kernel": "6.1.0-27-amd64", "image": "r/k:6.1.0-27-amd64", "state": "Exists"},
            {
                "kernel": "6.8.0-45-generic",
                "image": "r/k:6.8.0-45-generic",
                "state": "Signing",
                "pod": "kmod-built-sign-6-8-0-45-generic",
            },
        ],
    }
    stored["status"] = status
    await objects.replace_namespaced_custom_object_status(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj["metadata"]["name"], stored
    )
    read = await objects.get_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj["metadata"]["name"]
    )
    assert read["status"] == status
    assert modules.ModuleStatus.model_validate(read["status"]).images is not None
    stored = read
    stored["status"]["images"][0]["state"] = "Built"
    with pytest.raises(client.ApiException) as refused:
        await objects.replace_namespaced_custom_object_status(
            modules.GROUP,
            modules.VERSION,
            namespace,
            modules.PLURAL,
            obj["metadata"]["name"],
            stored,
        )
    assert "status.images[0].state" in json.loads(refused.value.body)["message"]


async def test_a_module_without_no_effect_fields_gets_no_warning(
    api_client: client.ApiClient, namespace: str
) -> None:
    """The control: the example (with registryTLS empty, as KMM's Go client
    writes its unset struct, or set) draws no warning, once warnings flow."""
    await install(api_client)
    await _warnings_flow(api_client, namespace, _build_sign_module())
    quiet = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    quiet["spec"]["moduleLoader"]["container"]["registryTLS"] = {}
    assert await create_with_warnings(api_client, namespace, quiet) == []
    # registryTLS set at both levels: no longer a no-effect field.
    tls = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    tls["spec"]["moduleLoader"]["container"]["registryTLS"] = {"insecure": True}
    _mappings(tls)[0]["registryTLS"] = {"insecureSkipTLSVerify": True}
    assert await create_with_warnings(api_client, namespace, tls) == []
    # Build and sign without kanikoParams: no warning either.
    built = _build_sign_module()
    del build_sign_cases.container(built)["build"]["kanikoParams"]
    assert await create_with_warnings(api_client, namespace, built) == []


_REGEXP_PATH = "spec.moduleLoader.container.kernelMappings[1].regexp"


def _table(*tables: tuple[tuple[str, str], ...]) -> list[Any]:
    return [pytest.param(pattern, id=name) for table in tables for name, pattern in table]


@pytest.mark.parametrize("pattern", _table(cases.ACCEPTED, cases.TOO_LARGE_FOR_KMM))
async def test_regexp_go_accepts_is_admitted(
    api_client: client.ApiClient, namespace: str, pattern: str
) -> None:
    await install(api_client)
    obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _regexp(pattern)(obj)
    assert await refusal(api_client, namespace, obj) is None
    kmm_error = regexps.error(pattern)
    assert kmm_error is None or "too large for kmm" in kmm_error


@pytest.mark.parametrize("pattern", _table(cases.REFUSED_PYTHON_ACCEPTS, cases.REFUSED))
async def test_regexp_go_refuses_is_refused_with_the_operators_message(
    api_client: client.ApiClient, namespace: str, pattern: str
) -> None:
    await install(api_client)
    obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _regexp(pattern)(obj)
    message = await refusal(api_client, namespace, obj)
    assert message is not None, "admitted"
    # What the operator reports for the same Module (DESIGN §3: it repeats
    # admission): the same field and the same reason, word for word.
    with pytest.raises(validation.InvalidModuleError) as refused:
        validation.parse_module(obj)
    [violation] = refused.value.violations
    assert violation.path == _REGEXP_PATH
    assert (
        f'{_REGEXP_PATH}: Invalid value: "string": {violation.message} evaluating rule' in message
    )


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        pytest.param("my kmod", "moduleName", id="space-in-module-name"),
        pytest.param(
            "kmm_ci_b\ninstall kmm_ci_b /bin/true", "modulesLoadingOrder[1]", id="newline"
        ),
        pytest.param("kmm_ci_b\v", "modulesLoadingOrder[1]", id="vertical-tab"),
    ],
)
async def test_whitespace_in_a_module_name_is_refused(
    api_client: client.ApiClient, namespace: str, entry: str, field: str
) -> None:
    """The CRD rule bites as the operator's check does (modulesLoadingOrder
    entries become lines of a modprobe.d file in the loader pod)."""
    await install(api_client)
    obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    modprobe = obj["spec"]["moduleLoader"]["container"]["modprobe"]
    order = modprobe["modulesLoadingOrder"]
    if field == "moduleName":
        modprobe["moduleName"] = order[0] = entry
    else:
        order[1] = entry
    message = await refusal(api_client, namespace, obj)
    assert message is not None, "admitted"
    path = f"spec.moduleLoader.container.modprobe.{field}"
    assert path in message, message
    assert "must be a kernel module name: no whitespace" in message, message
    with pytest.raises(validation.InvalidModuleError) as refused:
        validation.parse_module(obj)
    # moduleName is also modulesLoadingOrder[0]: both are named then.
    assert path in [v.path for v in refused.value.violations]


async def _stored_as_sent(api_client: client.ApiClient, namespace: str, obj: Obj) -> Obj:
    """The stored Module, checked to be ``obj`` as sent: nothing pruned,
    nothing defaulted but ``modprobe.dirName``."""
    stored: Obj = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj["metadata"]["name"]
    )
    assert stored["spec"]["moduleLoader"]["container"]["modprobe"].pop("dirName") == "/opt"
    assert stored["spec"] == obj["spec"]
    return stored


async def test_image_names_are_judged_as_the_operator_judges_them(
    api_client: client.ApiClient, namespace: str
) -> None:
    """Each image rule in CEL (the API server) and in Python (the operator's
    validation) gives the same verdict on the same name, naming the same
    field and rule: one dry run per case."""
    await install(api_client)
    wrong: list[str] = []
    for case in image_cases.CASES:
        obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
        path = image_cases.place(case, obj)
        message = await refusal(api_client, namespace, obj)
        if case.message is None:
            if message is not None:
                wrong.append(f"{case.name}: refused: {message}")
            validation.parse_module(obj)
            continue
        if message is None or f"{path}: " not in message or case.message not in message:
            wrong.append(f"{case.name}: {message}")
        with pytest.raises(validation.InvalidModuleError):
            validation.parse_module(obj)
    assert wrong == []
