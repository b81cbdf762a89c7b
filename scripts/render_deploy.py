"""Write deploy/ from kmm.api: the manifests and the Helm chart.

The unit tests fail while a committed file differs from its rendering; this
is how a change to kmm.api reaches deploy/.
"""

from __future__ import annotations

import pathlib

from kmm.api import chart, manifests

DEPLOY = pathlib.Path(__file__).resolve().parents[1] / "deploy"

for path, text in {**manifests.files(), **chart.files()}.items():
    target = DEPLOY / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote deploy/{path}")
