"""The operator's ClusterRole: what build and sign add, and what they do not."""

from __future__ import annotations

from kmm.api import installation, modules, preflight


def _granted() -> set[tuple[str, str, str]]:
    (role, _binding) = installation.cluster_rbac()
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_build_and_sign_pods_are_made_and_removed_like_daemonsets() -> None:
    granted = _granted()
    # Cluster-wide, as the DaemonSets: wherever a Module lives.
    assert {("apps", "daemonsets", v) for v in ("create", "delete")} <= granted
    assert {("", "pods", v) for v in ("list", "watch", "create", "delete")} <= granted


def test_inputs_are_read_by_name_only() -> None:
    granted = _granted()
    assert {v for _, r, v in granted if r == "configmaps"} == {"get"}
    assert {v for _, r, v in granted if r == "secrets"} == {"get"}


def test_no_pod_logs_and_no_pod_updates() -> None:
    granted = _granted()
    assert not any(r.startswith("pods/") for _, r, _ in granted)
    assert {v for _, r, v in granted if r == "pods"} == {"list", "watch", "create", "delete"}


def test_preflight_validations_are_read_and_answered_through_status_only() -> None:
    granted = _granted()
    group = preflight.GROUP

    def verbs(resource: str) -> set[str]:
        return {v for g, r, v in granted if g == group and r == resource}

    assert verbs(preflight.PLURAL) == {"list", "watch"}
    # The reconciler merge-patches /status (Writer.patch_preflight_status):
    # never a get or an update (a full replace) of it.
    assert verbs(f"{preflight.PLURAL}/status") == {"patch"}
    # Preflight pods are owned by their validation with blockOwnerDeletion.
    assert verbs(f"{preflight.PLURAL}/finalizers") == {"update"}


def test_every_grant_is_a_request_the_operator_makes() -> None:
    """The whole ClusterRole, verb by verb. The operator reads through
    informers (list, watch) and writes only in kmm.operator.writing; a verb
    added here must name the request that needs it."""
    by_resource: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in _granted():
        by_resource.setdefault((group, resource), set()).add(verb)
    assert by_resource == {
        # informer; merge patch of metadata.finalizers
        (modules.GROUP, modules.PLURAL): {"list", "watch", "patch"},
        (modules.GROUP, f"{modules.PLURAL}/status"): {"patch"},
        # blockOwnerDeletion on the DaemonSets and build pods a Module owns
        (modules.GROUP, f"{modules.PLURAL}/finalizers"): {"update"},
        (preflight.GROUP, preflight.PLURAL): {"list", "watch"},
        (preflight.GROUP, f"{preflight.PLURAL}/status"): {"patch"},
        (preflight.GROUP, f"{preflight.PLURAL}/finalizers"): {"update"},
        # server-side apply (patch, and create when the DaemonSet is new), delete
        ("apps", "daemonsets"): {"get", "list", "watch", "create", "patch", "delete"},
        ("", "pods"): {"list", "watch", "create", "delete"},
        ("", "configmaps"): {"get"},
        ("", "secrets"): {"get"},
        ("", "nodes"): {"list", "watch", "patch"},
        ("", "events"): {"create"},
        ("resource.k8s.io", "deviceclasses"): {"list", "watch", "create", "patch", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"list", "watch"},
        # informers; create, server-side apply (patch), delete with a uid precondition
        ("resource.k8s.io", "devicetaintrules"): {"list", "watch", "create", "patch", "delete"},
        ("resource.k8s.io", "resourceslices"): {"list", "watch"},
    }
    (role, _binding) = installation.leader_election_rbac()
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
