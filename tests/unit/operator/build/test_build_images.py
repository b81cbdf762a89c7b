"""Which images a kernel that builds or signs has, and how each is asked
(``kmm.operator.build.images``)."""

from __future__ import annotations

import pytest

from kmm.operator.build import images


@pytest.mark.parametrize(
    ("final", "intermediate"),
    [
        ("reg.io/m:k", "reg.io/m:k-kmm-unsigned"),
        ("10.253.0.1:5000/a/b:6.12_x", "10.253.0.1:5000/a/b:6.12_x-kmm-unsigned"),
    ],
)
def test_intermediate_image_is_the_tag_plus_a_suffix(final: str, intermediate: str) -> None:
    assert images.intermediate_image(final) == intermediate


def test_intermediate_image_of_a_long_tag_is_cut_and_hashed() -> None:
    tag = "t" * 126
    found = images.intermediate_image(f"reg.io/m:{tag}")
    repository, _, new_tag = found.rpartition(":")
    assert repository == "reg.io/m"
    assert len(new_tag) == 128
    assert new_tag.endswith("-kmm-unsigned")
    assert images.intermediate_image(f"reg.io/m:{tag[:-1]}u") != found


@pytest.mark.parametrize("final", ["reg.io/m@sha256:" + "a" * 64, "reg.io:5000/m"])
def test_intermediate_image_needs_a_tag(final: str) -> None:
    with pytest.raises(ValueError, match=r"digest|no tag"):
        images.intermediate_image(final)
