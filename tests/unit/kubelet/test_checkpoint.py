"""The kubelet's checkpoint format, against the vectors of the 1.35.4 kubelet's own
``pkg/kubelet/cm/dra/state/checkpointer_test.go`` (copied here as data; the
1.37.2 file is the same), and 1.37.2's ``claiminfo_test.go`` for what 1.37 added."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from kmm.kubelet import checkpoint

# Files the kubelet wrote: each must decode and encode back byte for byte.
KUBELET_FILES = [
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"ShareID\":null,\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":2570581864}',
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"ShareID\":\"aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa\",\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":736302156}',
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"ShareID\":null,\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]},{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-2\",\"ShareID\":null,\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1223221469}',
    r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example-1\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"ShareID\":null,\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}},{\"ClaimUID\":\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\",\"ClaimName\":\"example-2\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-2\",\"ShareID\":null,\"RequestNames\":null,\"CDIDeviceIDs\":null}]}}}]}","Checksum":2820117767}',
]
INCORRECT_CHECKSUM = r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"Entries\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example-1\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"RequestNames\":[\"test request\"],\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}},{\"ClaimUID\":\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\",\"ClaimName\":\"example-2\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-2\",\"RequestNames\":null,\"CDIDeviceIDs\":null}]}}}]}","Checksum":2930258365}'
WITHOUT_REQUEST_NAMES = r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1137250765}'
VERSION_V0 = r'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v0\",\"ClaimInfoStateList\":[{\"ClaimUID\":\"067798be-454e-4be4-9047-1aa06aea63f7\",\"ClaimName\":\"example\",\"Namespace\":\"default\",\"PodUIDs\":{\"139cdb46-f989-4f17-9561-ca10cfb509a6\":{}},\"DriverState\":{\"test-driver.cdi.k8s.io\":{\"Devices\":[{\"PoolName\":\"worker-1\",\"DeviceName\":\"dev-1\",\"CDIDeviceIDs\":[\"example.com/example=cdi-example\"]}]}}}]}","Checksum":1284376732}'


@pytest.mark.parametrize("blob", KUBELET_FILES)
def test_kubelet_files_round_trip_byte_for_byte(blob: str) -> None:
    assert checkpoint.encode(checkpoint.decode(blob.encode())) == blob.encode()


def test_the_documented_checksum() -> None:
    claims = [
        checkpoint.ClaimState(
            claim_uid="067798be-454e-4be4-9047-1aa06aea63f7",
            claim_name="example",
            namespace="default",
            pod_uids=frozenset({"139cdb46-f989-4f17-9561-ca10cfb509a6"}),
            driver_state={
                "test-driver.cdi.k8s.io": (
                    checkpoint.Device(
                        pool_name="worker-1",
                        device_name="dev-1",
                        request_names=("test request",),
                        cdi_device_ids=("example.com/example=cdi-example",),
                    ),
                )
            },
        )
    ]
    written = checkpoint.encode(claims)
    assert written.endswith(b'"Checksum":2570581864}')
    assert written == KUBELET_FILES[0].encode()


def test_an_empty_state_is_the_real_kubelets_empty_file() -> None:
    # As the 1.35.4 kubelet of a sandbox kubelet node wrote it once its pods were gone.
    assert checkpoint.encode([]) == (
        rb'{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":'
        rb'\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":[]}",'
        rb'"Checksum":2361995144}'
    )


def test_html_characters_are_escaped_as_go_does() -> None:
    claim = checkpoint.ClaimState("u", "a<b>&c", "ns", frozenset(), {})
    written = checkpoint.encode([claim])
    assert b"<" not in written
    assert b">" not in written
    assert b"&" not in written
    assert rb"\\u003c" in written
    assert checkpoint.decode(written) == [claim]


def test_a_checksum_mismatch_is_corrupt() -> None:
    with pytest.raises(checkpoint.CorruptCheckpoint, match="checkpoint is corrupted"):
        checkpoint.decode(INCORRECT_CHECKSUM.encode())


def test_invalid_json_is_corrupt() -> None:
    with pytest.raises(checkpoint.CorruptCheckpoint, match="not JSON"):
        checkpoint.decode(b"{")


def test_an_older_kubelets_file_loads_with_zero_values() -> None:
    (claim,) = checkpoint.decode(WITHOUT_REQUEST_NAMES.encode())
    (device,) = (claim.driver_state or {})["test-driver.cdi.k8s.io"]
    assert device.request_names is None
    assert device.share_id is None
    assert device.cdi_device_ids == ("example.com/example=cdi-example",)
    (old,) = checkpoint.decode(VERSION_V0.encode())
    assert old.claim_name == "example"


def test_store_reports_a_corrupt_file_and_leaves_it(tmp_path: Path) -> None:
    store = checkpoint.Store(tmp_path)
    assert store.load() == []
    store.path.write_text(INCORRECT_CHECKSUM)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="checkpoint is corrupted"):
        store.load()
    assert store.path.read_text() == INCORRECT_CHECKSUM


def test_store_saves_atomically_and_reads_back(tmp_path: Path) -> None:
    store = checkpoint.Store(tmp_path / "var/lib/kubelet")
    claims = checkpoint.decode(KUBELET_FILES[-1].encode())
    store.save(claims)
    assert store.path.read_bytes() == KUBELET_FILES[-1].encode()
    assert store.load() == claims
    assert [p.name for p in store.path.parent.iterdir()] == [checkpoint.FILE_NAME]


def _wrapped(entries: str) -> bytes:
    """A checkpoint file around a ``ClaimInfoStateList`` as the kubelet wraps it."""
    inner = (
        '{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1",'
        f'"ClaimInfoStateList":{entries}}}'
    )
    return json.dumps({"Data": inner, "Checksum": zlib.crc32(inner.encode())}).encode()


# The 1.37.2 kubelet's pkg/kubelet/cm/dra/claiminfo_test.go,
# TestCheckpointVersionCompatibility: a 1.37 entry with skipNodeOperations,
# and one as an older kubelet wrote it (both with lower-case field names,
# which Go's decoder matches regardless of case).
VERSION_N = (
    '[{"claimUID":"uid-1","claimName":"claim-1","namespace":"default",'
    '"driverState":{"gpu.com":{"skipNodeOperations":["*"]}}}]'
)
VERSION_N_MINUS_1 = (
    '[{"claimUID":"uid-2","claimName":"claim-2","namespace":"default",'
    '"driverState":{"gpu.com":{"devices":[]}}}]'
)


def test_1_37_skip_node_operations_are_read_and_field_names_match_regardless_of_case() -> None:
    (claim,) = checkpoint.decode(_wrapped(VERSION_N))
    assert claim == checkpoint.ClaimState(
        claim_uid="uid-1",
        claim_name="claim-1",
        namespace="default",
        driver_state={"gpu.com": ()},
        skip_node_operations={"gpu.com": ("*",)},
    )
    (older,) = checkpoint.decode(_wrapped(VERSION_N_MINUS_1))
    assert older.claim_uid == "uid-2"
    assert older.driver_state == {"gpu.com": ()}
    assert older.skip_node_operations == {}


def test_skip_node_operations_are_written_after_the_devices_and_only_when_set() -> None:
    device = checkpoint.Device("pool", "dev", None, ("r",), ("x=y",))
    claim = checkpoint.ClaimState(
        "u",
        "c",
        "ns",
        frozenset({"p"}),
        {"a.example.com": (device,), "b.example.com": ()},
        skip_node_operations={"b.example.com": ("NodePrepareResources",)},
    )
    written = checkpoint.encode([claim])
    inner = json.loads(written)["Data"]
    # DriverState.SkipNodeOperations is `json:"skipNodeOperations,omitempty"`
    # (state/state.go), after Devices; a driver with no device is Go's nil.
    assert '"a.example.com":{"Devices":[{' in inner
    assert '"b.example.com":{"Devices":null,"skipNodeOperations":["NodePrepareResources"]}' in inner
    assert "skipNodeOperations" not in inner.split('"b.example.com"')[0]
    assert checkpoint.decode(written) == [claim]
