"""The emulated Node's status: the 1.37 kubelet's version and declared features."""

from __future__ import annotations

from pathlib import Path

from kmm.kubelet import emulator, nodeoperations, nodes


def test_the_node_reports_the_1_37_kubelet_and_declares_no_feature_by_default() -> None:
    status = nodes.node_status(emulator.Options(node=nodes.NodeSpec("n"), root=Path()).node_spec)
    assert status["nodeInfo"]["kubeletVersion"] == "v1.37.2-kmm-emulator"
    assert "declaredFeatures" not in status  # omitempty


def test_optional_node_operations_are_declared_for_the_scheduler() -> None:
    options = emulator.Options(node=nodes.NodeSpec("n"), root=Path(), optional_node_operations=True)
    assert nodes.node_status(options.node_spec)["declaredFeatures"] == [nodeoperations.FEATURE]
    assert nodeoperations.FEATURE == "DRAOptionalNodeOperations"
