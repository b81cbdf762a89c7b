"""``kmm claims``' rows from ResourceClaims as the API server returns them."""

from __future__ import annotations

from kmm.cli import claiming


def test_an_allocated_reserved_claim_names_its_node_devices_and_pods() -> None:
    claim = {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "d.example.com", "pool": "n1", "device": "dev0", "request": "r"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        },
    }
    assert claiming.claim_row(claim) == [
        "ns",
        "c",
        "allocated,reserved",
        "n1",
        "d.example.com/n1/dev0",
        "p",
    ]


def test_a_pending_claim_and_a_deleting_one() -> None:
    assert claiming.claim_row({"metadata": {"namespace": "ns", "name": "c"}}) == [
        "ns",
        "c",
        "pending",
        "-",
        "-",
        "-",
    ]
    deleting = {"metadata": {"namespace": "ns", "name": "c", "deletionTimestamp": "t"}}
    assert claiming.claim_row(deleting)[2] == "deleting"
