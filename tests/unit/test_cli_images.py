"""``kmm status`` and ``kmm modules`` as printed: each kernel's image from ``status.images``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from kmm.api import labels
from kmm.cli import listing, tables, upgrading
from kmm.operator import inspecting

KERNEL_A = "6.12.48+deb13-amd64"
KERNEL_B = "6.8.0-45-generic"
IMAGES = [
    {
        "kernel": KERNEL_A,
        "image": "10.253.0.1:5000/ns/m:6.12.48-deb13-amd64",
        "state": "BuildFailed",
        "pod": "m-build-6-12-48-deb13-amd64",
        "message": "STEP 4/7: RUN make: exit status 2",
    },
    {
        "kernel": KERNEL_B,
        "image": "10.253.0.1:5000/ns/m:6.8.0-45-generic",
        "state": "Signing",
        "pod": "m-sign-6-8-0-45-generic",
    },
]
MODULE: dict[str, Any] = {
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {"selector": {"kmm": "yes"}},
    "status": {"images": IMAGES},
}


def node(name: str, kernel: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kmm": "yes"}},
        "status": {"nodeInfo": {"kernelVersion": kernel}},
    }


def rendered(table: Any) -> list[str]:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text().splitlines()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]


def test_status_shows_each_nodes_kernel_image_with_its_pod_and_why() -> None:
    states = inspecting.states(
        MODULE, [node("n1", KERNEL_A), node("n2", KERNEL_B), node("n3", "5.14.0")], []
    )
    lines = rendered(upgrading.status_table(states))
    header, *rows = [cells(line) for line in lines if "│" in line or "┃" in line]
    assert header[:3] == ["NODE", "KERNEL", "IMAGE"]
    assert [row[:3] for row in rows] == [
        [
            "n1",
            KERNEL_A,
            "build failed (pod m-build-6-12-48-deb13-amd64): STEP 4/7: RUN make: exit status 2",
        ],
        ["n2", KERNEL_B, "signing (pod m-sign-6-8-0-45-generic)"],
        ["n3", "5.14.0", "-"],
    ]


def test_modules_shows_one_line_per_kernel_image(capsys: pytest.CaptureFixture[str]) -> None:
    ready = {labels.ready("ns", "m"): ""}
    loaded = node("n2", KERNEL_B)
    loaded["metadata"]["labels"] |= ready
    tables.show(listing.COLUMNS, [listing.module_row(MODULE, [loaded], [])])
    table = [cells(line) for line in capsys.readouterr().out.splitlines() if "│" in line]
    # A cell of two lines is two table lines: the second carries only that cell.
    assert [row[-1] for row in table] == [
        f"{KERNEL_A}: build failed (pod m-build-6-12-48-deb13-amd64)",
        f"{KERNEL_B}: signing (pod m-sign-6-8-0-45-generic)",
    ]
    assert table[0][:5] == ["ns", "m", "-", "0/0", "n2"]


def test_a_module_without_images_shows_a_dash() -> None:
    assert listing.images_cell({"metadata": {"name": "m", "namespace": "ns"}}) == "-"


def test_an_upgrade_step_is_one_line_whatever_its_length_and_brackets() -> None:
    """``kmm upgrade`` piped to a log: a step naming pods (about 260
    characters for one under NoSchedule) stays one line, ``[`` included."""
    out = io.StringIO()
    line = "n0: remove the device-plugin version label; pod work/p[0] " + "x" * 300
    upgrading.say(Console(file=out, width=80), line)
    assert out.getvalue() == line + "\n"
