"""An informer on ConfigMaps against a real API server sees create, update, delete."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kubernetes_asyncio import client

from kmm.kube import client as kube_client
from kmm.kube import listwatch, resources
from kmm.runtime import informers, stores

pytestmark = pytest.mark.integration

TIMEOUT = 60.0


async def eventually(predicate: Callable[[], bool], *, poll: float = 0.05) -> None:
    """Wait for a condition the real cluster brings about; fail after TIMEOUT."""
    for _ in range(int(TIMEOUT / poll)):
        if predicate():
            return
        await asyncio.sleep(poll)
    raise AssertionError(f"condition not reached in {TIMEOUT}s: {predicate}")


def configmap(name: str, data: dict[str, str], *, labels: dict[str, str]) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data=data)


async def test_informer_follows_configmaps(
    api_client: client.ApiClient, kmm_api: kube_client.Client, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_config_map(
        namespace, configmap("before", {"k": "0"}, labels={"test": "yes"})
    )
    events: list[tuple[str, str]] = []
    informer = informers.Informer(
        "configmaps",
        listwatch.ApiListWatch(
            kmm_api, resources.Resource("", "v1", "configmaps"), namespace=namespace
        ),
        label_selector="test=yes",
        projection=stores.keep_fields("data", "metadata.labels"),
        indexers={"value": lambda o: [o.get("data", {}).get("k", "")]},
    )
    informer.add_handler(
        informers.FuncHandler(
            add=lambda o: events.append(("add", o["metadata"]["name"])),
            update=lambda _old, new: events.append(("update", new["metadata"]["name"])),
            delete=lambda o: events.append(("delete", o["metadata"]["name"])),
        )
    )
    stop = asyncio.Event()
    run = asyncio.ensure_future(informer.run(stop))
    try:
        async with asyncio.timeout(TIMEOUT):
            await informer.wait_synced()
        assert informer.store.list_keys() == [f"{namespace}/before"]
        assert informer.store.index_keys("value", "0") == [f"{namespace}/before"]

        # Unlabelled first: the watch is ordered, so once "cm" is seen, "ignored" never will be.
        await core.create_namespaced_config_map(
            namespace, configmap("ignored", {"k": "x"}, labels={"test": "no"})
        )
        await core.create_namespaced_config_map(
            namespace, configmap("cm", {"k": "1"}, labels={"test": "yes"})
        )
        await eventually(lambda: informer.store.get(f"{namespace}/cm") is not None)
        assert informer.store.get(f"{namespace}/ignored") is None

        await core.patch_namespaced_config_map("cm", namespace, {"data": {"k": "2"}})
        await eventually(lambda: informer.store.index_keys("value", "2") == [f"{namespace}/cm"])
        stored = informer.store.get(f"{namespace}/cm")
        assert stored is not None
        assert stored["data"] == {"k": "2"}
        assert "managedFields" not in stored["metadata"]

        await core.delete_namespaced_config_map("cm", namespace)
        await eventually(lambda: informer.store.get(f"{namespace}/cm") is None)
        assert events == [("add", "before"), ("add", "cm"), ("update", "cm"), ("delete", "cm")]
    finally:
        stop.set()
        await run
