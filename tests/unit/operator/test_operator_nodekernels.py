"""``nodekernels``: which nodes get their ``kernel-version.full`` put right, and to what."""

from __future__ import annotations

from typing import Any

import pytest

from kmm.api import labels
from kmm.operator import nodekernels


def node(kernel: str | None, label: str | None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "labels": {} if label is None else {labels.KERNEL_VERSION_FULL: label},
        },
        "status": {"nodeInfo": {} if kernel is None else {"kernelVersion": kernel}},
    }


@pytest.mark.parametrize(
    ("kernel", "label", "wanted"),
    [
        ("6.8.0-50-generic", "6.8.0-45-generic", "6.8.0-50-generic"),  # rebooted
        ("5.14.0-427.el9.x86_64+", "6.1.0-27-amd64", "5.14.0-427.el9.x86_64"),  # one + trimmed
        ("6.6.0+rt+", "x", "6.6.0_rt"),  # the label-safe value, as on DaemonSets
        ("6.8.0-45-generic", "6.8.0-45-generic", None),  # right
        ("5.14.0-427.el9.x86_64+", "5.14.0-427.el9.x86_64", None),
        ("6.8.0-45-generic", None, None),  # never labelled: left alone
        (None, "6.8.0-45-generic", None),  # kernel unknown
        ("", "6.8.0-45-generic", None),
    ],
)
def test_stale(kernel: str | None, label: str | None, wanted: str | None) -> None:
    assert nodekernels.stale(node(kernel, label)) == wanted
    assert nodekernels.node_keys(node(kernel, label)) == ([] if wanted is None else ["n1"])
