"""Admission with the manifests from deploy/, while the operator runs.

Each invalid Module is refused by the API server (CRD rules or the
ValidatingAdmissionPolicy) with a message naming the field; since it never
exists, the operator creates nothing for it: no DaemonSet, no Event, no label.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.sandbox import testing

manifests = support.manifests

Obj = dict[str, Any]


def _mapping(index: int, key: str, value: Any) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        obj["spec"]["moduleLoader"]["container"]["kernelMappings"][index][key] = value

    return mutate


def _container(key: str, value: Any) -> Callable[[Obj], None]:
    return lambda obj: obj["spec"]["moduleLoader"]["container"].__setitem__(key, value)


CASES: list[tuple[str, Callable[[Obj], None], tuple[str, ...]]] = [
    ("regexp-does-not-compile", _mapping(1, "regexp", "^(6.1"), ("kernelMappings[1].regexp",)),
    (
        "image-without-tag",
        _mapping(0, "containerImage", "example.com/literal/kmm-test"),
        ("kernelMappings[0].containerImage", "tag"),
    ),
    (
        "literal-and-regexp",
        _mapping(0, "regexp", "^6$"),
        ("kernelMappings[0]", "literal", "regexp"),
    ),
    (
        "name-too-long",
        lambda obj: obj["metadata"].__setitem__("name", "n" * labels.MAX_NAME_AND_NAMESPACE),
        ("metadata.name",),
    ),
    (
        "build-without-dockerfile",
        _mapping(0, "build", {"buildArgs": [{"name": "A", "value": "1"}]}),
        ("container.kernelMappings", "build.dockerfileConfigMap is required"),
    ),
    (
        "sign-without-cert",
        _container("sign", {"keySecret": {"name": "k"}, "filesToSign": ["/opt/a.ko"]}),
        ("container.kernelMappings", "sign.certSecret is required"),
    ),
]


@pytest.mark.parametrize(("mutate", "fragments"), [pytest.param(m, f, id=i) for i, m, f in CASES])
async def test_refused_naming_the_field_and_nothing_created(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    namespace: str,
    mutate: Callable[[Obj], None],
    fragments: tuple[str, ...],
) -> None:
    select = f"kmm-test/{namespace}"
    body = copy.deepcopy(support.module_body("refused", {select: "yes"}))
    mutate(body)
    objects = client.CustomObjectsApi(api_client)

    # The operator watches every namespace: Modules other tests left behind
    # (their namespaces still terminating) would be written to and counted.
    async def no_module_anywhere() -> bool:
        listed = await objects.list_cluster_custom_object(
            modules.GROUP, modules.VERSION, modules.PLURAL
        )
        return not listed["items"]

    await testing.eventually(no_module_anywhere, "Modules of earlier tests are gone")
    async with (
        support.selecting(api_client, sandbox.node_names[:1], select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await testing.eventually(running.synced, "caches synced")
        with pytest.raises(client.ApiException) as refused:
            await objects.create_namespaced_custom_object(
                modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
            )
        assert refused.value.status in (400, 403, 422)
        message = refused.value.body if isinstance(refused.value.body, str) else ""
        for fragment in fragments:
            assert fragment in message, message
        listed = await objects.list_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL
        )
        assert listed["items"] == []
        assert await support.loader_daemonsets(api_client, namespace) == []
        events = await client.CoreV1Api(api_client).list_namespaced_event(namespace)
        assert events.items == []
        assert dict(running.counter.writes) == {}


async def test_operator_repeats_validation_degraded_event_nothing_made(
    sandbox: testing.RunningSandbox, manifests: None, api_client: client.ApiClient, namespace: str
) -> None:
    """A Module admission lets through but kmm.api refuses (a regexp over RE2's
    memory budget, which Go's regexp accepts) is reported Degraded with one
    Warning Event, and nothing is created for it."""
    select = f"kmm-test/{namespace}"
    body = support.module_body("unicode", {select: "yes"})
    body["spec"]["moduleLoader"]["container"]["kernelMappings"][1]["regexp"] = r"^\pL{100}$"
    objects = client.CustomObjectsApi(api_client)
    async with (
        support.selecting(api_client, sandbox.node_names[:1], select),
        support.operator_in_process(sandbox.kubeconfig) as running,
    ):
        await objects.create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
        )

        async def degraded() -> bool:
            module = await support.get_module(api_client, namespace, "unicode")
            found = support.condition(module, "Degraded")
            return found is not None and found["status"] == "True"

        await testing.eventually(degraded, "Degraded condition")
        await running.wait_idle("settled")
        module = await support.get_module(api_client, namespace, "unicode")
        found = support.condition(module, "Degraded")
        assert found is not None
        assert found["reason"] == "InvalidSpec"
        assert "kernelMappings[1].regexp" in found["message"]
        events = await client.CoreV1Api(api_client).list_namespaced_event(namespace)
        assert [(e.type, e.reason) for e in events.items] == [("Warning", "InvalidSpec")]
        assert await support.loader_daemonsets(api_client, namespace) == []
        labelled = await support.node_labels(api_client)
        assert not any(labels.ready(namespace, "unicode") in lbl for lbl in labelled.values())
        running.counter.reset()
        running.op.resync()
        await running.wait_idle("resync")
        assert dict(running.counter.writes) == {}
        await objects.delete_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, "unicode"
        )

        async def gone() -> bool:
            return await support.get_module(api_client, namespace, "unicode") is None

        await testing.eventually(gone, "deleted (finalizer removed)")
