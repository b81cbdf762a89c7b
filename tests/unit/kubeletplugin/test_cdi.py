from __future__ import annotations

import json
import pathlib

import pytest

from kmm.kubeletplugin import cdi, claims, errors

UID = claims.ClaimUID("0f1e2d3c-aaaa-bbbb-cccc-123456789abc")


def test_claim_of_cdi_device_round_trips() -> None:
    specs = cdi.SpecDir(pathlib.Path("/unused"), vendor="gpu.example.com")
    (qualified,) = specs.device_ids(UID, 1)
    assert qualified == f"gpu.example.com/claim={UID}-0"
    assert cdi.claim_of_cdi_device(qualified) == ("gpu.example.com", UID, 0)


@pytest.mark.parametrize(
    "qualified",
    ["gpu.example.com/other=abc-0", "gpu.example.com/claim=plain", "nonsense", "x/claim"],
)
def test_other_devices_are_not_claim_devices(qualified: str) -> None:
    assert cdi.claim_of_cdi_device(qualified) is None


def test_container_claims_groups_by_claim_for_one_driver() -> None:
    ids = [
        f"a.example.com/claim={UID}-1",
        f"a.example.com/claim={UID}-0",
        "a.example.com/claim=abc-2",
        f"b.example.com/claim={UID}-5",
        "a.example.com/static=dev0",
    ]
    assert cdi.container_claims(ids, "a.example.com") == {UID: [0, 1], "abc": [2]}


@pytest.mark.parametrize("vendor", ["", "-bad", "a/b", "a..b/", "bad-"])
def test_invalid_vendor_names_are_refused(vendor: str) -> None:
    with pytest.raises(errors.CDIError):
        cdi.SpecDir(pathlib.Path("/unused"), vendor=vendor)


@pytest.mark.parametrize("uid", ["../x", "a/b", "", ".", "a b"])
def test_unsafe_uids_never_become_paths(tmp_path: pathlib.Path, uid: str) -> None:
    specs = cdi.SpecDir(tmp_path, vendor="v.example.com")
    with pytest.raises(errors.CDIError):
        specs.write(claims.ClaimUID(uid), [{"env": ["A=1"]}])
    assert list(tmp_path.iterdir()) == []


def test_spec_is_written_atomically_with_minimum_version(tmp_path: pathlib.Path) -> None:
    specs = cdi.SpecDir(tmp_path / "cdi", vendor="v.example.com")
    ids = specs.write(UID, [{"deviceNodes": [{"path": "/dev/x", "type": "c"}]}])
    (path,) = (tmp_path / "cdi").iterdir()
    spec = json.loads(path.read_text())
    assert spec["kind"] == "v.example.com/claim"
    assert ids == [f"v.example.com/claim={UID}-0"]
    # the UID starts with a digit: device names like that need 0.5.0
    assert spec["cdiVersion"] == "0.5.0"
    assert specs.remove(UID)
    assert not specs.remove(UID)


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        ({"kind": "a/b", "devices": [{"name": "dev", "containerEdits": {}}]}, "0.3.0"),
        ({"kind": "a/b", "devices": [{"name": "0dev", "containerEdits": {}}]}, "0.5.0"),
        # A device node's hostPath came in 0.5.0, whatever the device's name
        # (kmm driver's specs: containerd refused them as 0.3.0).
        (
            {
                "kind": "a/b",
                "devices": [
                    {
                        "name": "dev",
                        "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/x"}]},
                    }
                ],
            },
            "0.5.0",
        ),
        (
            {"kind": "a/b", "containerEdits": {"deviceNodes": [{"path": "/x", "hostPath": "/x"}]}},
            "0.5.0",
        ),
        (
            {
                "kind": "a/b",
                "devices": [
                    {
                        "name": "dev",
                        "containerEdits": {
                            "mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]
                        },
                    }
                ],
            },
            "0.4.0",
        ),
        ({"kind": "a/b", "annotations": {}, "devices": [{"name": "d"}]}, "0.6.0"),
        ({"kind": "a/b.c", "devices": [{"name": "d"}]}, "0.6.0"),
        (
            {"kind": "a/b", "devices": [{"name": "d", "containerEdits": {"additionalGIDs": [5]}}]},
            "0.7.0",
        ),
    ],
)
def test_minimum_version(spec: dict[str, object], version: str) -> None:
    assert cdi.minimum_version(spec) == version
