"""The node kernels: chosen from an archive's package names, one per line."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.api import kernels as api_kernels
from kmm.sandbox import errors
from kmm.sandbox.vmnodes import kernels

# As an archive lists them: old versions beside new ones, flavours that are
# not the node's (cloud, rt), unsigned builds, a newest image whose headers
# are not (yet or any more) served.
NAMES = [
    "linux-image-6.1.0-9-amd64",
    "linux-headers-6.1.0-9-amd64",
    "linux-image-6.1.0-41-amd64",
    "linux-headers-6.1.0-41-amd64",
    "linux-image-6.1.0-41-cloud-amd64",
    "linux-headers-6.1.0-41-cloud-amd64",
    "linux-image-6.1.0-41-amd64-unsigned",
    "linux-image-6.1.0-42-amd64",
    "linux-image-6.1.0-42-rt-amd64",
    "linux-headers-6.1.0-42-rt-amd64",
    "linux-image-6.12.99+deb12-amd64",
    "linux-headers-6.12.99+deb12-amd64",
    "linux-image-6.12.100+deb12-amd64",
    "linux-headers-6.12.100+deb12-amd64",
    "linux-image-6.12.100+deb12-cloud-amd64",
    "linux-headers-6.12.101+deb12-amd64",
    "linux-image-amd64",
    "linux-headers-amd64",
]


def test_the_newest_of_each_line_whose_image_and_headers_are_served() -> None:
    chosen = kernels.choose(NAMES)
    # 6.1.0-42 has no headers; 6.12.101 has no image; numbers compare as numbers.
    assert chosen.versions == ("6.1.0-41-amd64", "6.12.100+deb12-amd64")
    assert chosen.default == "6.1.0-41-amd64"
    assert chosen.other("6.1.0-41-amd64") == "6.12.100+deb12-amd64"


def test_a_line_with_no_complete_version_is_named() -> None:
    names = [name for name in NAMES if not name.startswith("linux-headers-6.12.")]
    with pytest.raises(errors.SandboxError, match=r"no 6\.12 kernel with both its image"):
        kernels.choose(names)


def test_the_list_keys_caches_and_names_images_tag_safe() -> None:
    first = kernels.choose(NAMES)
    newer = kernels.choose([*NAMES, "linux-image-6.1.0-43-amd64", "linux-headers-6.1.0-43-amd64"])
    assert newer.versions[0] == "6.1.0-43-amd64"
    assert first.key != newer.key
    assert first.tag("6.12.100+deb12-amd64") == "6.12.100_deb12-amd64"
    assert first.tag("6.12.100+deb12-amd64") == api_kernels.tag_safe("6.12.100+deb12-amd64")
    with pytest.raises(errors.SandboxError, match="not one the VM node image holds"):
        first.tag("6.8.0-45-generic")


@pytest.mark.parametrize(
    ("kernel", "tag"),
    [
        ("6.12.118+deb12-amd64", "6.12.118_deb12-amd64"),
        ("6.1.0-57-amd64", "6.1.0-57-amd64"),
        ("5.14.0-427.el9.x86_64+rt", "5.14.0-427.el9.x86_64_rt"),
        ("6.8.0~rc1 x", "6.8.0_rc1_x"),
    ],
)
def test_tag_safe_replaces_what_an_image_tag_may_not_hold(kernel: str, tag: str) -> None:
    assert api_kernels.tag_safe(kernel) == tag


def test_ensure_keeps_the_recorded_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def archive(suite: str) -> list[str]:
        asked.append(suite)
        return NAMES

    monkeypatch.setattr(kernels, "_archive_names", archive)
    assert kernels.load(tmp_path) is None
    chosen = kernels.ensure(tmp_path)
    assert kernels.load(tmp_path) == chosen
    # Recorded: the archive is not asked again (a warm build needs no network).
    assert kernels.ensure(tmp_path) == chosen
    assert asked == ["bookworm"]
    kernels.ensure(tmp_path, refresh=True)
    assert asked == ["bookworm", "bookworm"]
