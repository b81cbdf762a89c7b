"""The operator's build-and-sign settings (its flags), shared by the build
concern and the preflight reconciler."""

from __future__ import annotations

import dataclasses
from typing import Final

from kmm.operator.build import pods

__all__ = ["DEFAULT_POLL", "Settings"]

DEFAULT_POLL: Final = 10.0


@dataclasses.dataclass(frozen=True)
class Settings:
    builder_image: str = pods.DEFAULT_BUILDER_IMAGE
    registry_ca: str = ""  # PEM bundle handed to the pods
    retention: float = 0.0  # seconds a succeeded pod is kept
    poll: float = DEFAULT_POLL  # seconds between looks at a failed pod's inputs
