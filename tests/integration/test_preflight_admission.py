"""The PreflightValidation CRD from deploy/ on a real apiserver.

It is accepted (its CEL rules within the cost budget) and Established under
its names; v1beta1 is not served; each rule refuses as the Python validators
do, with the shared table of tests/preflight_cases.py; the status is written
through its subresource only, keyed by namespace and name.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import preflight_cases as cases
import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import crd, preflight
from kmm.cli import applying
from kmm.kube import client as kube_client

manifests = support.manifests

Obj = dict[str, Any]


def _name() -> str:
    return f"pfv-{uuid.uuid4().hex[:8]}"


async def _refusal(api: client.ApiClient, obj: Obj) -> str | None:
    """The apiserver's message refusing a dry-run create of ``obj``, or None."""
    try:
        await client.CustomObjectsApi(api).create_cluster_custom_object(
            preflight.GROUP, preflight.VERSION, preflight.PLURAL, obj, dry_run="All"
        )
    except client.ApiException as err:
        message: str = json.loads(err.body)["message"]
        return message
    return None


@contextlib.asynccontextmanager
async def _created(api: client.ApiClient, obj: Obj) -> AsyncIterator[Obj]:
    """``obj`` created (cluster-scoped: the session sandbox is shared), deleted after."""
    objects = client.CustomObjectsApi(api)
    stored: Obj = await objects.create_cluster_custom_object(
        preflight.GROUP, preflight.VERSION, preflight.PLURAL, obj
    )
    try:
        yield stored
    finally:
        await objects.delete_cluster_custom_object(
            preflight.GROUP, preflight.VERSION, preflight.PLURAL, obj["metadata"]["name"]
        )


async def _get(api: client.ApiClient, path: str, *, accept: str = "application/json") -> Obj:
    """A GET of any path (discovery, a Table), decoded."""
    found: Obj = await api.call_api(
        path,
        "GET",
        header_params={"Accept": accept},
        response_types_map={200: "object"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )
    return found


def _verdict(name: str, **changes: object) -> Obj:
    verdict: Obj = {
        "name": name,
        "namespace": "drivers",
        "verificationStatus": "InProgress",
        "verificationStage": "Image",
        "statusReason": preflight.REASON_IN_PROGRESS,
        "lastTransitionTime": "2026-07-01T12:00:00Z",
    }
    verdict.update(changes)
    return verdict


async def test_crd_is_established_under_its_names(
    manifests: None, api_client: client.ApiClient
) -> None:
    definition = await client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        crd.PREFLIGHT_NAME
    )
    conditions = {c.type: c.status for c in definition.status.conditions}
    assert conditions["Established"] == "True", conditions
    assert conditions["NamesAccepted"] == "True", conditions
    found = await _get(api_client, f"/apis/{preflight.GROUP}/{preflight.VERSION}")
    served = {r["name"]: r for r in found["resources"]}
    resource = served[preflight.PLURAL]
    assert resource["kind"] == preflight.KIND
    assert resource["namespaced"] is False
    assert resource["shortNames"] == ["pfv"]
    assert resource["singularName"] == preflight.SINGULAR
    assert f"{preflight.PLURAL}/status" in served


async def test_v1beta1_is_not_served(manifests: None, api_client: client.ApiClient) -> None:
    """KMM's v1beta1 is refused as unknown (the group's v1beta1 serves Modules only)."""
    obj = cases.validation(name=_name())
    obj["apiVersion"] = f"{preflight.GROUP}/v1beta1"
    with pytest.raises(client.ApiException) as refused:
        await client.CustomObjectsApi(api_client).create_cluster_custom_object(
            preflight.GROUP, "v1beta1", preflight.PLURAL, obj
        )
    assert refused.value.status == 404
    with pytest.raises(client.ApiException) as listed:
        await client.CustomObjectsApi(api_client).list_cluster_custom_object(
            preflight.GROUP, "v1beta1", preflight.PLURAL
        )
    assert listed.value.status == 404
    found = await _get(api_client, f"/apis/{preflight.GROUP}/v1beta1")
    assert "modules" in {r["name"] for r in found["resources"]}
    assert not any(r["name"].startswith(preflight.PLURAL) for r in found["resources"])


async def test_kmm_apply_of_a_v1beta1_manifest_names_the_version_not_served(
    manifests: None, kmm_api: kube_client.Client
) -> None:
    obj = cases.validation(name=_name())
    obj["apiVersion"] = f"{preflight.GROUP}/v1beta1"
    with pytest.raises(applying.ApplyError) as refused:
        await applying.apply_documents(kmm_api, [obj], wait_for_kinds=0)
    assert str(refused.value) == (
        "the API server does not serve PreflightValidation in kmm.sigs.x-k8s.io/v1beta1"
    )
    obj["apiVersion"] = preflight.API_VERSION
    assert await applying.apply_documents(kmm_api, [obj], dry_run=True) == [
        f"preflightvalidation/{obj['metadata']['name']} created (dry run)"
    ]


@pytest.mark.parametrize("kernel", cases.GOOD_KERNELS)
async def test_kernels_python_accepts_are_admitted(
    manifests: None, api_client: client.ApiClient, kernel: str
) -> None:
    obj = cases.validation(kernel, name=_name())
    preflight.parse(obj)
    assert await _refusal(api_client, obj) is None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in cases.CASES])
async def test_each_rule_refuses_as_python_does(
    manifests: None, api_client: client.ApiClient, case: cases.Case
) -> None:
    """Each rule in the CRD (the API server) and in Python refuses the same
    object, naming the same field and rule."""
    obj = cases.validation(name=_name())
    assert await _refusal(api_client, obj) is None
    case.mutate(obj)
    message = await _refusal(api_client, obj)
    assert message is not None, "admitted"
    assert f"{case.field}: " in message, message
    assert (case.cel_message or case.message) in message, message
    with pytest.raises(preflight.InvalidPreflightValidationError) as refused:
        preflight.parse(obj)
    found = [(v.path, v.message) for v in refused.value.violations]
    assert any(p == case.path and case.message in m for p, m in found), found


async def test_push_defaults_to_false_and_the_stored_object_parses(
    manifests: None, api_client: client.ApiClient
) -> None:
    obj = cases.validation("5.14.0-427.el9.x86_64+", name=_name())
    async with _created(api_client, obj) as stored:
        assert stored["spec"] == {**obj["spec"], "pushBuiltImage": False}
        parsed = preflight.parse(stored)
        assert parsed.spec.push_built_image is False
        assert preflight.kernel(parsed) == "5.14.0-427.el9.x86_64"
        assert "namespace" not in stored["metadata"]


async def test_status_is_written_through_its_subresource_keyed_by_namespace_and_name(
    manifests: None, api_client: client.ApiClient
) -> None:
    objects = client.CustomObjectsApi(api_client)
    name = _name()
    args = (preflight.GROUP, preflight.VERSION, preflight.PLURAL, name)
    async with _created(api_client, cases.validation(name=name)) as stored:
        # The main resource ignores status: only /status writes it.
        with_status = copy.deepcopy(stored)
        with_status["status"] = {"modules": [_verdict("a")]}
        replaced = await objects.replace_cluster_custom_object(*args, with_status)
        assert "status" not in replaced
        status = {
            "observedGeneration": replaced["metadata"]["generation"],
            "modules": [
                _verdict("a"),
                # Same name, another namespace: another entry.
                _verdict(
                    "a",
                    namespace="other",
                    verificationStatus="Success",
                    verificationStage="Done",
                    statusReason=preflight.REASON_BUILT
                    + "; the image was not pushed (pushBuiltImage is false)",
                    lastTransitionTime="2026-07-01T12:00:00.5+02:00",
                    image="registry.example/kmod:6.1.0-27-amd64",
                    pod=f"{name}-a",
                ),
            ],
        }
        replaced["status"] = status
        written = await objects.replace_cluster_custom_object_status(*args, replaced)
        assert written["status"] == status
        parsed = preflight.parse(written)
        assert parsed.status is not None
        assert parsed.status.observed_generation == replaced["metadata"]["generation"]
        # A second verdict for one (namespace, name) is refused by the list-map.
        written["status"]["modules"].append(_verdict("a", statusReason="again"))
        with pytest.raises(client.ApiException) as duplicate:
            await objects.replace_cluster_custom_object_status(*args, written)
        assert "status.modules[2]: Duplicate value" in json.loads(duplicate.value.body)["message"]
        # Values outside the API are refused naming the field, as Python does.
        for field, value in (
            ("verificationStatus", "Succeeded"),
            ("verificationStage", "Build"),
            ("lastTransitionTime", "yesterday"),
        ):
            bad = copy.deepcopy(written)
            bad["status"]["modules"] = [_verdict("a", **{field: value})]
            with pytest.raises(client.ApiException) as refused:
                await objects.replace_cluster_custom_object_status(*args, bad)
            message = json.loads(refused.value.body)["message"]
            assert f"status.modules[0].{field}: " in message, message
            with pytest.raises(preflight.InvalidPreflightValidationError):
                preflight.parse(bad)


async def test_printer_columns_show_kernel_and_push(
    manifests: None, api_client: client.ApiClient
) -> None:
    name = _name()
    async with _created(api_client, cases.validation("6.8.0-45-generic", name=name)):
        table = await _get(
            api_client,
            f"/apis/{preflight.GROUP}/{preflight.VERSION}/{preflight.PLURAL}/{name}",
            accept="application/json;as=Table;v=v1;g=meta.k8s.io",
        )
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == ["Name", "Kernel", "Push", "Age"]
    (row,) = table["rows"]
    assert row["cells"][:3] == [name, "6.8.0-45-generic", False]
