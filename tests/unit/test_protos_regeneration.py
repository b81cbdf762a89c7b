"""The committed gRPC stubs are exactly what the pinned grpcio-tools generate."""

from __future__ import annotations

import filecmp
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "src" / "kmm" / "kubeletplugin" / "protos"


def test_regenerating_the_stubs_changes_nothing(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    committed = sorted(p.name for p in COMMITTED.iterdir() if p.is_file())
    assert fresh == committed
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, COMMITTED, fresh, shallow=False)
    assert mismatch == []
    assert errors == []


def test_the_kubelet_names_are_kept() -> None:
    from kmm.kubeletplugin.protos import (
        dra_health_v1_pb2,
        dra_health_v1alpha1_pb2,
        dra_v1_pb2,
        dra_v1beta1_pb2,
        pluginregistration_pb2,
    )

    assert pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert dra_v1beta1_pb2.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert dra_health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1alpha1.DRAResourceHealth"
    )
    # The names plugins list in GetInfo: the 1.37 kubelet picks the first it knows.
    assert dra_health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1.DRAResourceHealth"
    )
    device = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in device.items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    health = dra_health_v1alpha1_pb2.DeviceHealth.DESCRIPTOR.fields_by_name
    assert health["health_check_timeout_seconds"].number == 4
