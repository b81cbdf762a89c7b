"""Which resource.k8s.io version serves DeviceTaintRules, from discovery answers of 1.35, 1.36 and 1.37."""

from __future__ import annotations

import asyncio

import kubeclients
import pytest
from scripted import Server

from kmm.api import labels
from kmm.operator import caches, deviceapis, deviceinformers, discovery, inflight, wiring
from kmm.runtime import informers, stores

_NOT_FOUND = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"}
_V1 = ["deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"]


def _served(*names: str) -> tuple[int, dict[str, object]]:
    return 200, {"kind": "APIResourceList", "resources": [{"name": n} for n in names]}


# Discovery answers for /apis/resource.k8s.io/{v1,v1beta2,v1alpha3}, in that order.
_SERVERS = {
    # 1.35: v1 without rules; v1alpha3 off by default (not served).
    "1.35": (_served(*_V1), (404, _NOT_FOUND), (404, _NOT_FOUND)),
    # 1.36 by default: v1beta2 is served only when enabled, rules only with their gate.
    "1.36": (_served(*_V1), (404, _NOT_FOUND), (404, _NOT_FOUND)),
    "1.36 gate on, v1beta2 off": (_served(*_V1), (404, _NOT_FOUND), (404, _NOT_FOUND)),
    "1.36 with v1beta2": (_served(*_V1), _served(*_V1, "devicetaintrules"), (404, _NOT_FOUND)),
    "1.37": (_served(*_V1, "devicetaintrules"), _served(*_V1), (404, _NOT_FOUND)),
    "1.35 with v1alpha3": (_served(*_V1), (404, _NOT_FOUND), _served("devicetaintrules")),
}


@pytest.mark.parametrize(
    ("server", "version"),
    [
        ("1.35", None),
        ("1.36", None),
        ("1.36 gate on, v1beta2 off", None),
        ("1.36 with v1beta2", "v1beta2"),
        ("1.37", "v1"),
        ("1.35 with v1alpha3", "v1alpha3"),
    ],
)
async def test_the_version_is_found_by_discovery(server: str, version: str | None) -> None:
    async with Server() as fake, kubeclients.for_server(fake.url, max_attempts=1) as api:
        fake.script(*_SERVERS[server])
        served = await deviceinformers.served_versions(
            lambda api_version, stop: discovery.serves(api, api_version, stop), asyncio.Event()
        )
        assert [s.path for s in fake.seen] == [
            "/apis/resource.k8s.io/v1",
            "/apis/resource.k8s.io/v1beta2",
            "/apis/resource.k8s.io/v1alpha3",
        ]
    assert deviceapis.taint_rules_version(served) == version


def test_the_newest_serving_version_wins() -> None:
    every = {v: {"devicetaintrules"} for v in deviceapis.VERSIONS}
    assert deviceapis.taint_rules_version(every) == "v1"
    assert deviceapis.taint_rules_version({"v1": {"deviceclasses"}}) is None
    assert deviceapis.taint_rules_version({}) is None
    assert deviceapis.rules_resource("v1beta2").path(name="r") == (
        "/apis/resource.k8s.io/v1beta2/devicetaintrules/r"
    )


async def test_the_device_informers_list_the_chosen_version_and_requeue_their_modules() -> None:
    modules = stores.Store(indexers={caches.DRIVER_INDEX: caches.module_driver_index})
    modules.put({"metadata": {"name": "m", "namespace": "ns"}, "spec": {"dra": {"driverName": "gpu.example.com"}}})  # fmt: skip
    enqueued: list[str] = []

    def requeueing(informer: informers.Informer, handler: informers.Handler) -> None:
        informer.add_handler(handler)

    async with Server() as fake, kubeclients.for_server(fake.url, max_attempts=1) as api:
        found = deviceinformers.DeviceInformers(
            api,
            modules_store=modules,
            pending=inflight.Pending(),
            requeueing=requeueing,
            enqueue=enqueued.append,
        )
        with pytest.raises(RuntimeError, match="before its API version was chosen"):
            await found.rules.source.list_page(
                label_selector=None, field_selector=None, limit=1, continue_token=None
            )
        assert found.start("v1beta2") == (found.slices, found.rules)
        fake.script((200, {"metadata": {"resourceVersion": "1"}, "items": []}))
        await found.rules.source.list_page(
            label_selector=labels.ROLE, field_selector=None, limit=1, continue_token=None
        )
        assert fake.seen[0].path == "/apis/resource.k8s.io/v1beta2/devicetaintrules"
    found.slices.replace(
        [
            {
                "metadata": {"name": "s", "resourceVersion": "1"},
                "spec": {"driver": "gpu.example.com", "nodeName": "n0", "pool": {"name": "n0"}},
            }
        ],
        "1",
    )
    found.rules.replace(
        [
            {
                "metadata": {
                    "name": "r",
                    "resourceVersion": "1",
                    "labels": labels.module_labels("ns", "gone", "dra"),
                }
            }
        ],
        "1",
    )
    assert enqueued == ["ns/m", "ns/gone"]


@pytest.mark.parametrize(
    ("rules_in", "expected"),
    [("v1", "v1"), ("v1beta2", "v1beta2"), (None, None)],
)
async def test_the_operator_runs_the_device_informers_only_where_rules_are_served(
    rules_in: str | None, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Operator.run`` asks discovery (DRA, PreflightValidations, then each
    resource.k8s.io version) and starts the slice and rule informers, on the
    chosen version, only when one serves rules; the caches say which."""
    answers = [
        _served(*_V1, *(("devicetaintrules",) if rules_in == "v1" else ())),
        (404, _NOT_FOUND),  # no PreflightValidation CRD
        _served(*_V1, *(("devicetaintrules",) if rules_in == "v1" else ())),
        _served(*_V1, "devicetaintrules") if rules_in == "v1beta2" else (404, _NOT_FOUND),
        (404, _NOT_FOUND),
    ]
    async with Server() as fake, kubeclients.for_server(fake.url, max_attempts=1) as api:
        fake.script(*answers)
        operator = wiring.Operator(api)
        ran: list[str] = []

        async def run(stop: asyncio.Event) -> None:
            ran.extend(i.name for i in operator.manager._informers)  # type: ignore[attr-defined]

        monkeypatch.setattr(operator.manager, "run", run)
        await operator.run(asyncio.Event())
        if expected is not None:
            fake.script((200, {"metadata": {"resourceVersion": "1"}, "items": []}))
            await operator.device_informers.rules.source.list_page(
                label_selector=None, field_selector=None, limit=1, continue_token=None
            )
            assert fake.seen[-1].path == f"/apis/resource.k8s.io/{expected}/devicetaintrules"
    assert operator.caches.taint_api == expected
    assert operator.reconciler.caches.taint_api == expected
    device = {"resourceslices", "devicetaintrules"}
    assert (device <= set(ran)) is (expected is not None)
    assert (device <= {i.name for i in operator.informers()}) is (expected is not None)
    assert operator.caches.slices is operator.device_informers.slices.store


async def test_an_operator_told_not_to_use_device_taints_asks_no_version_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--no-device-taints`` on a 1.37 server: discovery is asked for DRA
    and PreflightValidations only, no slice or rule informer runs, and the
    caches say the taints are off (the reason a Module's status gives)."""
    answers = [_served(*_V1, "devicetaintrules"), (404, _NOT_FOUND)]
    async with Server() as fake, kubeclients.for_server(fake.url, max_attempts=1) as api:
        fake.script(*answers)
        operator = wiring.Operator(api, device_taints=False)
        ran: list[str] = []

        async def run(stop: asyncio.Event) -> None:
            ran.extend(i.name for i in operator.manager._informers)  # type: ignore[attr-defined]

        monkeypatch.setattr(operator.manager, "run", run)
        await operator.run(asyncio.Event())
        assert len(fake.seen) == len(answers)
    assert operator.caches.taint_api is None
    assert operator.reconciler.caches.taints_off
    assert not {"resourceslices", "devicetaintrules"} & set(ran)
    assert "resourceclaims" in ran
