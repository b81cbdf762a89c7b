"""Who uses a node's tainted devices, and whom a NoExecute taint evicts (the eviction controller's rule)."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.operator.upgrade import deviceusers

KEY, VALUE = "kmm.node.kubernetes.io/upgrade", "ns.m"
DRIVER = "gpu.example.com"
NODE = {"metadata": {"name": "n0", "labels": {}}}


def _tainted(effect: str = "NoExecute", *, pools: set[str] | None = None, devices: set[tuple[str, str]] | None = None) -> deviceusers.Tainted:  # fmt: skip
    return deviceusers.Tainted(
        driver=DRIVER,
        pools={"n0"} if pools is None and devices is None else (pools or set()),
        devices=devices or set(),
        key=KEY,
        value=VALUE,
        effect=effect,
    )


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"key": KEY, "operator": "Exists", "effect": "NoExecute"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, True),  # every key
        ({"key": KEY, "operator": "Equal", "value": VALUE, "effect": "NoExecute"}, True),
        ({"key": KEY, "value": VALUE, "effect": "NoExecute"}, True),  # Equal by default
        ({"key": KEY, "value": "other", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists", "effect": "NoExecute"}, False),
        # An empty effect matches every effect for the scheduler, but the
        # eviction controller reads only NoExecute tolerations.
        ({"key": KEY, "operator": "Exists"}, False),
        ({"key": KEY, "operator": "Exists", "effect": "NoSchedule"}, False),
        # Evicted when the seconds run out.
        ({"key": KEY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}, False),
        ({"key": KEY, "operator": "Gt", "value": VALUE, "effect": "NoExecute"}, False),
    ],
)
def test_the_eviction_controllers_toleration_rule(
    toleration: dict[str, Any], tolerates: bool
) -> None:
    assert deviceusers.tolerates(toleration, key=KEY, value=VALUE, effect="NoExecute") is tolerates


def _claim(
    name: str, *, node: str = "n0", pool: str = "n0", device: str = "d0", driver: str = DRIVER,
    tolerations: list[dict[str, Any]] | None = None, reserved: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    result = {"request": "r", "driver": driver, "pool": pool, "device": device}
    if tolerations is not None:
        result["tolerations"] = tolerations
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "metadata": {"name": name, "namespace": "work"},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{name}", "uid": "u"}]
            if reserved is None
            else reserved,
        },
    }


_TOLERATES = [{"key": KEY, "operator": "Exists", "effect": "NoExecute"}]


def test_users_are_the_pods_whose_reserved_claims_hold_tainted_devices_on_the_node() -> None:
    claims = [
        _claim("a"),
        _claim("b", tolerations=_TOLERATES),
        _claim("elsewhere", node="n1", pool="n1"),
        _claim("other-driver", driver="nic.example.com"),
        _claim("not-reserved", reserved=[]),
        _claim("not-a-pod", reserved=[{"apiGroup": "x.io", "resource": "things", "name": "t"}]),
    ]
    found = deviceusers.users(claims, NODE, tainted=_tainted())
    assert found == deviceusers.Users(evicted=("work/pod-a",), staying=("work/pod-b",))
    # NoSchedule evicts nobody.
    assert deviceusers.users(claims, NODE, tainted=_tainted("NoSchedule")) == deviceusers.Users(
        staying=("work/pod-a", "work/pod-b")
    )


def test_single_devices_cover_only_themselves() -> None:
    claims = [_claim("a", pool="shared", device="d0"), _claim("b", pool="shared", device="d7")]
    found = deviceusers.users(claims, NODE, tainted=_tainted(devices={("shared", "d0")}))
    assert found.evicted == ("work/pod-a",)
    assert not found.staying


def test_a_pod_with_one_evicted_claim_is_evicted() -> None:
    shared = [{"resource": "pods", "name": "both", "uid": "u"}]
    claims = [
        _claim("a", reserved=shared),
        _claim("b", device="d1", tolerations=_TOLERATES, reserved=shared),
    ]
    assert deviceusers.users(claims, NODE, tainted=_tainted()) == deviceusers.Users(
        evicted=("work/both",)
    )
