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
from typing import Any

import pytest
import regexp_cases as cases
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
        "build",
        lambda obj: _mappings(obj)[0].__setitem__("build", {"dockerfileConfigMap": {"name": "x"}}),
        ("kernelMappings[0].build", "not supported by kmm"),
    ),
    (
        "sign",
        lambda obj: obj["spec"]["moduleLoader"]["container"].__setitem__("sign", {"keySecret": {}}),
        ("container.sign", "not supported by kmm"),
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


async def test_registry_tls_is_admitted_with_a_warning_naming_it(
    api_client: client.ApiClient, namespace: str
) -> None:
    await install(api_client)
    obj = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _mappings(obj)[0]["registryTLS"] = {"insecure": True}
    obj["spec"]["moduleLoader"]["container"]["registryTLS"] = {"insecureSkipTLSVerify": False}
    # The warnings policy bites once the apiserver's policy informer has it
    # (install waited for the refusing one only): dry runs until it answers.
    for _ in range(120):
        if await create_with_warnings(api_client, namespace, obj, dry_run=True):
            break
        await asyncio.sleep(0.5)
    found = await create_with_warnings(api_client, namespace, obj)
    assert len(found) == 2, found
    assert "spec.moduleLoader.container.registryTLS has no effect" in found[0] + found[1]
    assert "kernelMappings[].registryTLS has no effect" in found[0] + found[1]
    stored = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, obj["metadata"]["name"]
    )
    assert stored["spec"] == obj["spec"]
    # The operator's own validation (DESIGN §3: it repeats admission) takes it too.
    validation.parse_module(stored)
    # KMM ignores parameters and args beside rawArgs; kmm does too, and says so.
    raw = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _modprobe({"rawArgs": {"load": ["x"], "unload": ["-r", "x"]}, "parameters": ["a=1"]})(raw)
    [ignored] = await create_with_warnings(api_client, namespace, raw, dry_run=True)
    assert "spec.moduleLoader.container.modprobe.parameters" in ignored, ignored
    assert "have no effect with rawArgs" in ignored, ignored


async def test_a_module_without_no_effect_fields_gets_no_warning(
    api_client: client.ApiClient, namespace: str
) -> None:
    """The control: the example (and an empty registryTLS, which KMM's Go
    client writes for its unset struct) draws no warning, once warnings flow."""
    await install(api_client)
    noisy = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    _mappings(noisy)[0]["registryTLS"] = {"insecure": False}
    for _ in range(120):
        if await create_with_warnings(api_client, namespace, noisy, dry_run=True):
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the warnings policy never took effect")
    quiet = examples.module(name=f"m-{uuid.uuid4().hex[:6]}")
    quiet["spec"]["moduleLoader"]["container"]["registryTLS"] = {}
    assert await create_with_warnings(api_client, namespace, quiet) == []


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
