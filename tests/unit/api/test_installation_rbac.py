"""The operator's ClusterRole: what build and sign add, and what they do not."""

from __future__ import annotations

from kmm.api import installation, preflight


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

    assert verbs(preflight.PLURAL) == {"get", "list", "watch"}
    assert verbs(f"{preflight.PLURAL}/status") == {"get", "update", "patch"}
    # Preflight pods are owned by their validation with blockOwnerDeletion.
    assert verbs(f"{preflight.PLURAL}/finalizers") == {"update"}
