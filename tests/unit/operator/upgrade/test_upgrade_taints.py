"""Device taints in ordered upgrades: which rules a moving node gets, and what holds its driver."""

from __future__ import annotations

import copy
import re
from typing import Any

import operator_fixtures as fixtures
import pytest

from kmm.api import labels
from kmm.operator import caches, deviceapis, planners, views
from kmm.operator.dra import builders as dra_builders
from kmm.operator.upgrade import planner as upgrade_planner
from kmm.operator.upgrade import taints
from kmm.runtime import stores

K68 = fixtures.KERNELS[0]
DRIVER = "gpu.example.com"
NS, NAME = "ns", "m"
USER, LOADER, PLUGIN = (
    labels.module_version(NS, NAME),
    labels.module_loader_version(NS, NAME),
    labels.device_plugin_version(NS, NAME),
)
READY, VERSION_READY = labels.ready(NS, NAME), labels.version_ready(NS, NAME)
A = upgrade_planner.Action


def _raw(*, evict: bool = False, version: str | None = "v2", uid: str = "uid-1") -> dict[str, Any]:
    raw = fixtures.module_raw(
        dra={"driverName": DRIVER, "container": {"image": "r.io/driver:1"}},
    )
    if version is not None:
        raw["spec"]["moduleLoader"]["container"]["version"] = version
    raw["metadata"]["uid"] = uid
    if evict:
        raw["metadata"]["annotations"] = {labels.EVICT_DEVICE_USERS: "true"}
    return raw


def _node(name: str, *, user: str | None, at: str | None, ready: str | None) -> dict[str, Any]:
    """A node whose operator labels are at version ``at`` (loader and plugin)
    and whose ``.version.ready`` is ``ready``."""
    extra: dict[str, str] = {READY: ""} if at else {}
    for key, value in ((USER, user), (LOADER, at), (PLUGIN, at), (VERSION_READY, ready)):
        if value is not None:
            extra[key] = value
    return fixtures.node(name, K68, extra=extra)


def _moving() -> dict[str, Any]:
    return _node("n0", user="v2", at="v1", ready="v1")


def _done() -> dict[str, Any]:
    return _node("n1", user="v2", at="v2", ready="v2")


def _slice(node: str | None, *, pool: str | None = None, driver: str = DRIVER, devices: tuple[str, ...] = ("d0", "d1")) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or "shared"},
        "devices": [{"name": d} for d in devices],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": f"{node}-{driver}-{pool}"}, "spec": spec}


def _driver_pods(raw: dict[str, Any], *nodes: str) -> list[dict[str, Any]]:
    ds = dra_builders.daemonset(fixtures.module(raw))
    ds["metadata"]["uid"] = "uid-ds-dra"
    return [fixtures.pod(ds, n) for n in nodes]


def _claim(
    name: str, node: str, *, pods: tuple[str, ...] = ("p",), tolerations: list[Any] | None = None,
    driver: str = DRIVER, device: str = "d0",
) -> dict[str, Any]:  # fmt: skip
    result: dict[str, Any] = {"request": "r", "driver": driver, "pool": node, "device": device}
    if tolerations is not None:
        result["tolerations"] = tolerations
    return {
        "metadata": {"name": name, "namespace": "work"},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"u-{p}"} for p in pods],
        },
    }


def _view(
    raw: dict[str, Any],
    nodes: list[dict[str, Any]],
    *,
    pods: list[dict[str, Any]] | None = None,
    slices: list[dict[str, Any]] | None = None,
    rules: list[dict[str, Any]] | None = None,
    claims: list[dict[str, Any]] | None = None,
    api: str | None = "v1",
    rivals: dict[str, list[str]] | None = None,
    off: bool = False,
) -> views.ModuleView:
    store = stores.Store()
    for node in nodes:
        store.put(node)
    key = f"{NS}/{NAME}"
    return views.build(
        raw,
        fixtures.module(raw),
        nodes=store,
        daemonsets=(),
        pods=_driver_pods(raw, "n0") if pods is None else pods,
        labelled=[n for n in nodes if key in caches.node_module_index(n)],
        claims=claims or (),
        taint_api=api,
        taints_off=off,
        slices=[_slice("n0"), _slice("n1")] if slices is None else slices,
        taint_rules=rules or (),
        rivals=rivals,
    )


def _observed(rule: dict[str, Any], *, uid: str = "uid-rule") -> dict[str, Any]:
    """``rule`` as the cache shows it once made."""
    found = copy.deepcopy(rule)
    found["metadata"]["uid"] = uid
    found["metadata"]["resourceVersion"] = "5"
    return found


def _plugin_label(asked: planners.Answers, node: str) -> object:
    return asked.upgrade.labels.get(node, {}).get(PLUGIN, "unchanged")


def test_without_a_served_api_the_upgrade_goes_on_as_before_and_says_why() -> None:
    raw = _raw()
    asked = planners.ask(_view(raw, [_moving(), _done()], api=None))
    assert (asked.taints.create, asked.taints.apply, asked.taints.delete) == ([], [], [])
    assert _plugin_label(asked, "n0") is None  # the driver leaves at once, as today
    shown = planners.device_taints(asked.taints)
    assert shown is not None
    assert shown.message == deviceapis.NOT_SERVED
    assert shown.message.startswith(
        "device taints not used: the API server does not serve resource.k8s.io devicetaintrules"
    )


@pytest.mark.parametrize("evict", [False, True])
def test_without_a_served_api_the_users_of_a_moving_nodes_devices_hold_its_driver(
    evict: bool,
) -> None:
    # Opted in or not, nothing can evict: the driver stays while a pod's
    # claim holds a device of its driver on the node, so that the kubelet can
    # unprepare the claim once the pod is deleted.
    claims = [
        _claim("a", "n0", pods=("user",)),
        _claim("c", "n1", pods=("elsewhere",)),
        _claim("d", "n0", pods=("other-driver",), driver="nic.example.com"),
    ]
    view = _view(_raw(evict=evict), [_moving(), _done()], api=None, slices=[], claims=claims)
    asked = planners.ask(view)
    assert (asked.taints.create, asked.taints.apply, asked.taints.delete) == ([], [], [])
    assert _plugin_label(asked, "n0") == "unchanged"
    assert asked.upgrade.steps["n0"].description == (
        "pod work/user uses the Module's devices (no device taints: not evicted; delete it "
        "to go on); waiting for their claims to be released before removing the "
        "device-plugin version label"
    )
    shown = planners.device_taints(asked.taints)
    assert shown is not None
    assert shown.message == deviceapis.NOT_SERVED
    assert shown.nodes is not None
    [node] = shown.nodes
    assert (node.node, node.effect, node.rules, node.rules_ready) == ("n0", None, None, None)
    assert (node.staying, node.evicted) == (["work/user"], None)
    # ``kmm upgrade`` and ``kmm status`` read the same hold from the status.
    written = {"status": {"deviceTaints": shown.model_dump(exclude_none=True)}}
    assert upgrade_planner.holdings(written) == asked.taints.holdings()
    # An operator told not to use them says so instead, and holds the same.
    off = planners.ask(
        _view(_raw(evict=evict), [_moving()], api=None, slices=[], claims=claims, off=True)
    )
    shown = planners.device_taints(off.taints)
    assert shown is not None
    assert shown.message == deviceapis.TURNED_OFF
    assert _plugin_label(off, "n0") == "unchanged"
    # The claim released: the driver goes.
    released = planners.ask(_view(_raw(evict=evict), [_moving()], api=None, slices=[]))
    assert _plugin_label(released, "n0") is None


def test_a_moving_node_gets_a_noschedule_rule_per_pool_of_its_own_slices() -> None:
    raw = _raw()
    asked = planners.ask(_view(raw, [_moving(), _done()]))
    [rule] = asked.taints.create
    assert rule["apiVersion"] == "resource.k8s.io/v1"
    assert rule["kind"] == "DeviceTaintRule"
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "n0"},
        "taint": {"key": labels.TAINT_KEY, "value": "ns.m", "effect": "NoSchedule"},
    }
    assert rule["metadata"]["labels"] == {
        **labels.module_labels(NS, NAME, "dra"),
        labels.MODULE_UID: "uid-1",
    }
    assert rule["metadata"]["annotations"][labels.TAINTED_NODE] == "n0"
    # The done node n1 gets none, though its slice is the driver's.
    assert set(asked.taints.nodes) == {"n0"}
    # The driver stays until the rule is in the cache.
    assert _plugin_label(asked, "n0") == "unchanged"
    assert asked.upgrade.steps["n0"].description.startswith(
        "waiting for the NoSchedule DeviceTaintRules on the node's devices"
    )


def test_opted_in_the_rule_is_noexecute_in_the_served_version() -> None:
    asked = planners.ask(_view(_raw(evict=True), [_moving()], api="v1beta2"))
    [rule] = asked.taints.create
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert "unprepare the claims of the pods they evict" in asked.upgrade.steps["n0"].description


def test_the_driver_leaves_once_its_rules_are_in_place_and_no_claim_holds_a_device() -> None:
    raw = _raw(evict=True)
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    asked = planners.ask(_view(raw, [_moving()], rules=[_observed(rule)]))
    assert (asked.taints.create, asked.taints.apply, asked.taints.delete) == ([], [], [])
    assert _plugin_label(asked, "n0") is None
    assert asked.upgrade.steps["n0"].action is A.REMOVE_PLUGIN_LABEL


def test_a_changed_effect_is_applied_and_holds_the_driver_until_seen() -> None:
    [rule] = planners.ask(_view(_raw(), [_moving()])).taints.create
    observed = _observed(rule)
    asked = planners.ask(_view(_raw(evict=True), [_moving()], rules=[observed]))
    [(desired, found)] = asked.taints.apply
    assert desired["spec"]["taint"]["effect"] == "NoExecute"
    assert found is observed
    assert _plugin_label(asked, "n0") == "unchanged"


def test_evicted_and_tolerating_pods_hold_the_driver_and_are_named() -> None:
    raw = _raw(evict=True)
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    tolerating = [{"key": labels.TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]
    claims = [
        _claim("a", "n0", pods=("evicted",)),
        _claim("b", "n0", pods=("stays",), tolerations=tolerating, device="d1"),
        _claim("c", "n1", pods=("elsewhere",)),
        _claim("d", "n0", pods=("other-driver",), driver="nic.example.com"),
    ]
    asked = planners.ask(_view(raw, [_moving()], rules=[_observed(rule)], claims=claims))
    assert _plugin_label(asked, "n0") == "unchanged"
    assert asked.upgrade.steps["n0"].description == (
        "pod work/evicted evicted by the NoExecute device taint (no word from the eviction "
        "controller yet: kube-controller-manager evicts only with its DRADeviceTaintRules "
        "feature on); pod work/stays tolerates the NoExecute device taint and keeps the "
        "unload waiting until it is deleted; waiting for their claims to be released "
        "before removing the device-plugin version label"
    )
    # The API serves rules whatever the gates: the controller's answer is said.
    answered = _observed(rule)
    answered["status"] = {
        "conditions": [
            {"type": "EvictionInProgress", "status": "True", "message": "1 pod to evict"}
        ]
    }
    asked = planners.ask(_view(raw, [_moving()], rules=[answered], claims=claims))
    assert asked.upgrade.steps["n0"].description.startswith(
        "pod work/evicted evicted by the NoExecute device taint (the eviction controller: "
        "1 pod to evict); "
    )
    shown = planners.device_taints(asked.taints)
    assert shown is not None
    assert shown.nodes is not None
    [node] = shown.nodes
    assert (node.node, node.effect, node.evicted, node.staying) == (
        "n0", "NoExecute", ["work/evicted"], ["work/stays"],
    )  # fmt: skip
    assert node.rules == [rule["metadata"]["name"]]
    assert node.eviction == "1 pod to evict"


def test_under_noschedule_every_user_stays_and_the_admin_is_told_how_to_go_on() -> None:
    raw = _raw()
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    claims = [_claim("a", "n0", pods=("user",))]
    asked = planners.ask(_view(raw, [_moving()], rules=[_observed(rule)], claims=claims))
    described = asked.upgrade.steps["n0"].description
    assert described.startswith("pod work/user uses the Module's devices (NoSchedule: not evicted")
    assert f'{labels.EVICT_DEVICE_USERS}="true"' in described
    assert _plugin_label(asked, "n0") == "unchanged"


def test_only_slices_of_the_modules_driver_on_the_node_where_its_driver_runs_count() -> None:
    raw = _raw()
    others = [_slice("n0", driver="nic.example.com"), _slice("n1")]
    assert planners.ask(_view(raw, [_moving()], slices=others)).taints.create == []
    # Its driver not on the node: whoever published there, not this Module's.
    no_driver = planners.ask(_view(raw, [_moving()], pods=[]))
    assert no_driver.taints.create == []
    assert _plugin_label(no_driver, "n0") is None


def test_a_pool_that_spans_other_nodes_is_tainted_device_by_device() -> None:
    slices = [_slice("n0", pool="shared"), _slice("n1", pool="shared", devices=("d9",))]
    asked = planners.ask(_view(_raw(), [_moving()], slices=slices))
    assert sorted(r["spec"]["deviceSelector"]["device"] for r in asked.taints.create) == [
        "d0",
        "d1",
    ]
    assert {r["spec"]["deviceSelector"]["pool"] for r in asked.taints.create} == {"shared"}


def test_a_node_where_another_module_runs_the_same_driver_is_not_tainted() -> None:
    asked = planners.ask(_view(_raw(), [_moving()], rivals={"n0": ["other/m2", "other/m2"]}))
    assert asked.taints.create == []
    assert asked.taints.nodes["n0"].message == (
        "devices not tainted: Module other/m2 also runs a DRA driver named gpu.example.com "
        "on the node, whose devices cannot be told from this Module's"
    )
    assert _plugin_label(asked, "n0") is None  # as without taints


def test_rules_stay_for_the_whole_move_once_the_driver_and_its_slices_left() -> None:
    raw = _raw()
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    # Its plugin label gone, the driver gone, its slices wiped.
    node = _moving()
    del node["metadata"]["labels"][PLUGIN]
    asked = planners.ask(_view(raw, [node], pods=[], slices=[], rules=[_observed(rule)]))
    assert (asked.taints.create, asked.taints.delete) == ([], [])
    assert asked.taints.nodes["n0"].rules == (rule["metadata"]["name"],)


def test_rules_go_when_the_node_reaches_its_version() -> None:
    raw = _raw()
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    observed = _observed(rule)
    reached = _node("n0", user="v2", at="v2", ready="v2")
    assert planners.ask(_view(raw, [reached], rules=[observed])).taints.delete == [observed]


def test_an_earlier_modules_rules_go_and_a_rule_without_a_uid_label_stays() -> None:
    raw = _raw()
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    earlier = _observed(rule, uid="uid-old")
    earlier["metadata"]["name"] = "earlier"
    earlier["metadata"]["labels"][labels.MODULE_UID] = "uid-0"
    unstamped = _observed(rule, uid="uid-x")
    unstamped["metadata"]["name"] = "unstamped"
    del unstamped["metadata"]["labels"][labels.MODULE_UID]
    asked = planners.ask(_view(raw, [_done()], rules=[earlier, unstamped]))
    assert asked.taints.delete == [earlier]


def test_a_module_without_versions_wants_no_rule_and_shows_no_taints() -> None:
    raw = _raw()
    [rule] = planners.ask(_view(raw, [_moving()])).taints.create
    observed = _observed(rule)
    unversioned = _raw(version=None)
    asked = planners.ask(_view(unversioned, [_moving()], rules=[observed]))
    assert asked.taints.delete == [observed]
    assert planners.device_taints(asked.taints) is None


@pytest.mark.parametrize(
    ("user", "at", "ready", "kept", "moving"),
    [
        ("v2", "v1", "v1", False, True),  # chosen: the user label differs
        ("v2", "v1", None, False, True),
        ("v2", None, None, True, True),  # unloaded, the new version on its way
        ("v2", "v2", None, True, True),  # loaded, its driver not Ready yet
        ("v2", "v2", "v2", True, False),  # done
        (None, "v1", "v1", False, True),  # removed: unloading
        (None, None, None, True, False),  # unloaded
        # A first load is no move: no older version, no device in use.
        ("v1", None, None, False, False),
        ("v1", "v1", None, False, False),
    ],
)
def test_a_node_moves_from_its_choice_until_it_reaches_the_users_version(
    user: str | None, at: str | None, ready: str | None, kept: bool, moving: bool
) -> None:
    node = _node("n0", user=user, at=at, ready=ready)
    view = _view(_raw(), [node])
    assert taints.moving(view, node, selected=True, kept=kept) is moving
    # A node the selector no longer picks counts as one whose user label is gone.
    assert taints.moving(view, node, selected=False, kept=kept) is (at is not None)


def test_a_first_load_makes_no_rule() -> None:
    """The DRA driver of the first version publishes its devices before the
    node is ready: no rule for that (seen on a VM node: one made and
    deleted within a second, two writes per node for nothing)."""
    loading = _node("n0", user="v2", at="v2", ready=None)
    asked = planners.ask(_view(_raw(), [loading]))
    assert (asked.taints.create, asked.taints.nodes) == ([], {})
    assert _plugin_label(asked, "n0") == "unchanged"


def test_rule_names_are_dns_subdomains_of_at_most_253_characters_and_distinct() -> None:
    long_node = ".".join(["n" * 60] * 4)
    names = {
        labels.taint_rule_name(
            "ns", "m", uid=uid, node=node, driver=DRIVER, pool="pool", device=device
        )
        for uid in ("uid-1", "uid-2")
        for node in ("n0", long_node)
        for device in ("", "d0")
    }
    assert len(names) == 8
    subdomain = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    for name in names:
        assert len(name) <= 253, name
        assert subdomain.match(name), name
    assert labels.taint_rule_name(
        "ns", "m", uid="u", node="n0", driver=DRIVER, pool="p"
    ).startswith("kmm.ns.m.n0-")
