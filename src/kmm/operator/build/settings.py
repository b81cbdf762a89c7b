"""The operator's build-and-sign settings (its flags), shared by the build
concern and the preflight reconciler.

``driver_toolkit_image`` (``--driver-toolkit-image``) is the template of
``DTK_AUTO`` (``toolkit``), judged when the settings are made.

The registry CA bundle (``--registry-ca``) travels to build, sign and
preflight pods in a pod annotation (``podparts``), and Kubernetes limits a
pod's annotations to 256 KiB in all: a bundle over ``MAX_REGISTRY_CA``
(which leaves room for the pods' other annotations) is refused when the
settings are made, naming the limit, rather than every pod at its create.
``DEFAULT_BUILDER_IMAGE`` is the image those pods run unless
``--builder-image`` names another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kmm.operator.build import toolkit

__all__ = [
    "DEFAULT_BUILDER_IMAGE",
    "DEFAULT_POLL",
    "MAX_REGISTRY_CA",
    "Settings",
    "registry_ca_bundle",
]

# The image `make image` tags build/kmm-builder-image.tar with: the operator's
# --builder-image default (and the chart's builder.image), beside kmm's own
# image (kmm.api.installation.IMAGE).
DEFAULT_BUILDER_IMAGE: Final = "ghcr.io/kmm/kmm-builder:0.1.0"

DEFAULT_POLL: Final = 10.0
# Bytes of PEM a pod annotation may carry: 256 KiB (the API server's limit on
# a pod's annotations, names included) less 16 KiB for the others (the
# input hash and its parts: at most ~11 KiB with 36 inputs of 253-character
# names).
MAX_REGISTRY_CA: Final = 240 * 1024


def _check(bundle: str) -> None:
    size = len(bundle.encode())
    if size > MAX_REGISTRY_CA:
        raise ValueError(
            f"the registry CA bundle is {size} bytes; build, sign and preflight pods carry it "
            f"in a pod annotation, which holds at most {MAX_REGISTRY_CA} bytes here "
            "(Kubernetes limits a pod's annotations to 256 KiB in all): trust fewer certificates"
        )


def registry_ca_bundle(files: Iterable[Path]) -> str:
    """The CA ``files`` as one PEM bundle for the pods; ValueError when it
    is too large for them."""
    bundle = "".join(path.read_text() for path in files)
    _check(bundle)
    return bundle


@dataclasses.dataclass(frozen=True)
class Settings:
    builder_image: str = DEFAULT_BUILDER_IMAGE
    registry_ca: str = ""  # PEM bundle handed to the pods
    retention: float = 0.0  # seconds a succeeded pod is kept
    poll: float = DEFAULT_POLL  # seconds between looks at a pod's inputs
    # DTK_AUTO's template, expanded per kernel ("": none passed).
    driver_toolkit_image: str = ""

    def __post_init__(self) -> None:
        _check(self.registry_ca)
        if self.driver_toolkit_image:
            toolkit.check_template(self.driver_toolkit_image)
