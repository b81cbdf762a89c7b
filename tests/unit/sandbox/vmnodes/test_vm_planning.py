"""What VM nodes are before they start (kmm.sandbox.vmnodes.planning): the
kernel asked for, a sandbox dir their control sockets fit in, the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmm.sandbox import errors
from kmm.sandbox.vmnodes import images, kernels, planning

CHOSEN = kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64"))


def test_the_kernel_asked_for_must_be_one_of_the_images(tmp_path: Path) -> None:
    image = images.NodeImage(directory=tmp_path, kernels=CHOSEN, root_uuid="u")
    assert planning.check_kernel(image, "") == CHOSEN.default
    assert planning.check_kernel(image, CHOSEN.versions[1]) == CHOSEN.versions[1]
    with pytest.raises(ValueError, match=r"--node-kernel '5\.10\.0-1-amd64' is not a kernel"):
        planning.check_kernel(image, "5.10.0-1-amd64")


def test_a_directory_too_deep_for_the_control_sockets_is_refused() -> None:
    with pytest.raises(errors.SandboxError, match="shorter directory"):
        planning.check_directory(Path("/tmp") / ("d" * 100))


def test_no_image_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(errors.SandboxError, match="make vm-image"):
        planning.find_image(tmp_path)
