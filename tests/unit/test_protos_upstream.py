"""Our .proto files are wire-compatible with the kubelet's own.

The kubelet's api.proto files come from k8s.io/kubelet at the version the
sandbox's Kubernetes tools module pins (already in the Go module cache once
the sandbox binaries are built; the Go proxy otherwise). Both sides are
compiled to descriptors and compared on what the wire and a third-party stub
see: package, services and method names with their streaming shape, and every
message's fields by number, name, type and label. Fields we declare beyond
the kubelet's (DeviceHealth.message, per DESIGN §6, which the kubelet has
itself from 1.37 on) are allowed where the pinned kubelet lacks them, as
proto3 readers skip unknown fields; a missing or changed one is not. A file
newer than the pinned kubelet (dra-health v1, new in 1.37) is compared with
the first kubelet that has it.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from kmm.sandbox import components

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Our file -> the kubelet's, relative to the k8s.io/kubelet module root.
PAIRS = {
    "pluginregistration.proto": "pkg/apis/pluginregistration/v1/api.proto",
    "dra_v1.proto": "pkg/apis/dra/v1/api.proto",
    "dra_v1beta1.proto": "pkg/apis/dra/v1beta1/api.proto",
    "dra_health_v1alpha1.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
    "dra_health_v1.proto": "pkg/apis/dra-health/v1/api.proto",
}
# Fields DESIGN §6 adds on top of the kubelet 1.35 definitions.
EXTRA_FIELDS = {("DeviceHealth", 5)}
# The first k8s.io/kubelet with a file, for those newer than the pin.
FIRST_WITH = {"dra_health_v1.proto": "v0.37.2"}


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is needed to locate k8s.io/kubelet (the sandbox needs it too)")
    return go


def _kubelet_at(version: str) -> pathlib.Path:
    """k8s.io/kubelet at ``version`` (downloaded into the module cache if missing)."""
    found = subprocess.run(
        [_go(), "mod", "download", "-json", f"k8s.io/kubelet@{version}"],
        cwd=components.KUBERNETES.directory,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return pathlib.Path(json.loads(found.stdout)["Dir"])


def _kubelet_module() -> pathlib.Path:
    go = _go()
    found = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubelet"],
        cwd=components.KUBERNETES.directory,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    directory = found.stdout.strip()
    if found.returncode != 0 or not directory:
        subprocess.run(
            [go, "mod", "download", "k8s.io/kubelet"],
            cwd=components.KUBERNETES.directory,
            check=True,
            timeout=600,
        )
        return _kubelet_module()
    return pathlib.Path(directory)


def _descriptor(proto: pathlib.Path, out: pathlib.Path) -> descriptor_pb2.FileDescriptorProto:
    code = protoc.main(
        ["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", str(proto.name)]
    )
    assert code == 0, f"protoc failed on {proto}"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    return {
        "package": file.package,
        "services": {
            service.name: {
                method.name: (
                    method.input_type,
                    method.output_type,
                    method.client_streaming,
                    method.server_streaming,
                )
                for method in service.method
            }
            for service in file.service
        },
        "messages": {
            message.name: {
                field.number: (field.name, field.type, field.label, field.type_name)
                for field in message.field
            }
            for message in file.message_type
        },
        "enums": {enum.name: {v.name: v.number for v in enum.value} for enum in file.enum_type},
    }


@pytest.mark.parametrize("ours", sorted(PAIRS))
def test_matches_the_kubelet_proto(ours: str, tmp_path: pathlib.Path) -> None:
    theirs = _kubelet_module() / PAIRS[ours]
    if not theirs.exists() and ours in FIRST_WITH:
        theirs = _kubelet_at(FIRST_WITH[ours]) / PAIRS[ours]
    ours_shape = _shape(_descriptor(ROOT / "proto" / ours, tmp_path / "ours.pb"))
    theirs_shape = _shape(_descriptor(theirs, tmp_path / "theirs.pb"))
    for message, number in EXTRA_FIELDS:
        if number not in theirs_shape["messages"].get(message, {}):
            ours_shape["messages"].get(message, {}).pop(number, None)
    assert ours_shape == theirs_shape
