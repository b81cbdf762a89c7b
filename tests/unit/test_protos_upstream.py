"""Our .proto files are wire-compatible with the kubelet's own, in every
Kubernetes minor kmm supports.

The kubelet's api.proto files come from k8s.io/kubelet of each supported
release (``kubereleases``), found in the Go module cache, where `make
kubelet-protos` (part of `make test`'s builds) puts them: the test asks
with ``GOPROXY=off``, so it never downloads, and names that step when a
module is missing. Both sides are compiled to
descriptors and compared on what the wire and a third-party stub see:
package, services and method names with their streaming shape, and every
message's fields by number, name, type and label. A field we declare beyond
a kubelet's (``EXTRA_FIELDS``) is allowed, as proto3 readers skip unknown
fields; a missing or changed one is not.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from kmm.sandbox import kubereleases

ROOT = pathlib.Path(__file__).resolve().parents[2]

# k8s.io/kubelet of every supported release (its staging version, v0.M.P
# for v1.M.P): what a kubelet of each dials must match what we serve.
KUBELET_VERSIONS = tuple(
    "v0" + release.version.removeprefix("v1") for release in kubereleases.RELEASES.values()
)
# Our file -> the kubelet's (relative to the k8s.io/kubelet module root), and
# the first version that has it.
PAIRS = {
    "pluginregistration.proto": ("pkg/apis/pluginregistration/v1/api.proto", "v0.35.4"),
    "dra_v1.proto": ("pkg/apis/dra/v1/api.proto", "v0.35.4"),
    "dra_v1beta1.proto": ("pkg/apis/dra/v1beta1/api.proto", "v0.35.4"),
    "dra_health_v1alpha1.proto": ("pkg/apis/dra-health/v1alpha1/api.proto", "v0.35.4"),
    "dra_health_v1.proto": ("pkg/apis/dra-health/v1/api.proto", "v0.37.2"),
}
# (file, message, field number) we declare where a kubelet may not:
# DeviceHealth.message (DESIGN §6), which the kubelet's v1alpha1 gained in 1.36.
EXTRA_FIELDS = {("dra_health_v1alpha1.proto", "DeviceHealth", 5)}


def _number(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.removeprefix("v").split("."))


CASES = [
    (ours, version)
    for ours, (_, since) in sorted(PAIRS.items())
    for version in KUBELET_VERSIONS
    if _number(version) >= _number(since)
]


def _kubelet_module(version: str, scratch: pathlib.Path) -> pathlib.Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is needed to locate k8s.io/kubelet (the sandbox needs it too)")
    # Outside any module, so no go.mod's requirements get in the way.
    found = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubelet@{version}"],
        cwd=scratch,
        # Never a download in a test; the checksum database was asked when
        # `make kubelet-protos` downloaded the module, the cache is only read.
        env={**os.environ, "GOPROXY": "off", "GOSUMDB": "off"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert found.returncode == 0, (
        f"k8s.io/kubelet@{version} is not in the Go module cache: run `make kubelet-protos` "
        f"({found.stderr or found.stdout})"
    )
    return pathlib.Path(json.loads(found.stdout)["Dir"])


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


@pytest.mark.parametrize(("ours", "version"), CASES)
def test_matches_the_kubelet_proto(ours: str, version: str, tmp_path: pathlib.Path) -> None:
    theirs = _kubelet_module(version, tmp_path) / PAIRS[ours][0]
    ours_shape = _shape(_descriptor(ROOT / "proto" / ours, tmp_path / "ours.pb"))
    theirs_shape = _shape(_descriptor(theirs, tmp_path / "theirs.pb"))
    for file, message, number in EXTRA_FIELDS:
        if file == ours and number not in theirs_shape["messages"].get(message, {}):
            ours_shape["messages"].get(message, {}).pop(number, None)
    assert ours_shape == theirs_shape


def test_every_proto_is_compared() -> None:
    assert sorted(PAIRS) == sorted(p.name for p in (ROOT / "proto").glob("*.proto"))
