"""The digest of what kmm's image is built from (docs/install.md "The image").

``scripts/build_image.sh`` records it in the image (label
``kmm.image.inputs``) and skips a build whose inputs, name and time have not
changed; ``tests/image/test_image.py`` computes it again and fails on an
image built from other inputs, telling to run ``make image``. The inputs:
every file of the wheel's sources (``src``, ``pyproject.toml``,
``README.md``; tracked and untracked, not ignored), the two build scripts,
and the distributions installed beside this Python (the versions the image
gets, as ``pip freeze`` lists them to the build), kmm's own left out.
Run by ``.venv/bin/python``: that venv's distributions are the ones meant.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (
    "src",
    "pyproject.toml",
    "README.md",
    "scripts/build_image.sh",
    "scripts/image_inputs.py",
)


def digest(root: Path = ROOT) -> str:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    found = hashlib.sha256()
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        path = root / name
        # A tracked file deleted from the work tree is not in the wheel.
        if path.is_file():
            found.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    versions = sorted(
        f"{dist.metadata['Name'].lower()}=={dist.version}"
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"].lower() != "kmm"
    )
    found.update("\n".join(versions).encode())
    return "sha256:" + found.hexdigest()


if __name__ == "__main__":
    sys.stdout.write(digest() + "\n")
