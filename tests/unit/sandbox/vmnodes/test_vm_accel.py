"""The accelerator choice: asked for, or probed once and cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import accel, images, kernels

IMAGE = images.NodeImage(
    directory=Path("/cache/vm/node-0123"),
    kernels=kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64")),
    root_uuid="7d39f111-7b9a-53dd-765b-cf37fce0d564",
)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[bool]:
    """Each probe's Secure Boot setting; the probe says KVM works with it off only."""
    asked: list[bool] = []

    async def probe(image: images.NodeImage, *, secure_boot: bool, timeout: float) -> bool:
        asked.append(secure_boot)
        return not secure_boot

    kvm = tmp_path / "kvm"
    kvm.touch()
    monkeypatch.setattr(accel, "_probe", probe)
    monkeypatch.setattr(accel, "_KVM", kvm)
    monkeypatch.setattr(accel, "_qemu_version", lambda: "QEMU emulator version 7.2.18")
    return asked


async def test_auto_probes_once_per_setting_and_caches_the_verdict(
    probes: list[bool], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    chosen = [
        await accel.choose("auto", cache_dir=cache, image=IMAGE, secure_boot=secure)
        for secure in (True, True, False, False)
    ]
    assert chosen == ["tcg", "tcg", "kvm", "kvm"]
    assert probes == [True, False]
    assert (cache / "vm" / "accel.json").is_file()


async def test_tcg_and_kvm_are_taken_as_asked(probes: list[bool], tmp_path: Path) -> None:
    for asked in ("tcg", "kvm"):
        got = await accel.choose(asked, cache_dir=tmp_path, image=IMAGE, secure_boot=True)  # type: ignore[arg-type]
        assert got == asked
    assert probes == []


async def test_no_dev_kvm(
    probes: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accel, "_KVM", tmp_path / "absent")
    assert await accel.choose("auto", cache_dir=tmp_path, image=IMAGE, secure_boot=False) == "tcg"
    assert probes == []
    with pytest.raises(errors.SandboxError, match="no /dev/kvm"):
        await accel.choose("kvm", cache_dir=tmp_path, image=IMAGE, secure_boot=False)


def test_a_verdict_holds_for_one_image_setting_host_and_qemu(probes: list[bool]) -> None:
    key = accel.verdict_key(IMAGE, secure_boot=True)
    assert "node-0123" in key
    assert "secure-boot=on" in key
    assert "7.2.18" in key
    assert key != accel.verdict_key(IMAGE, secure_boot=False)
