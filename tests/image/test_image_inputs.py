"""scripts/image_inputs.py: what makes build/kmm-image.tar stale.

The image test trusts an archive whose recorded inputs digest equals the
work tree's; these cases show the digest moves with every change the wheel
would see (a source edited, added or deleted) and with nothing else (an
ignored file, a file's time).
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import imagearchives
import pytest


def _script() -> ModuleType:
    path = imagearchives.ROOT / "scripts" / "image_inputs.py"
    spec = importlib.util.spec_from_file_location("image_inputs", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    files = {
        ".gitignore": "__pycache__/\n",
        "pyproject.toml": "[project]\nname = 'kmm'\n",
        "README.md": "# kmm\n",
        "scripts/build_image.sh": "#!/bin/sh\n",
        "src/kmm/__init__.py": "",
        "src/kmm/cli.py": "print('kmm')\n",
        "tests/test_cli.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for command in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *command], cwd=tmp_path, check=True, timeout=60)
    return tmp_path


def test_the_digest_moves_with_the_sources_and_nothing_else(checkout: Path) -> None:
    digest = _script().digest
    first = digest(checkout)
    assert first.startswith("sha256:")
    assert digest(checkout) == first

    cli = checkout / "src" / "kmm" / "cli.py"
    cli.write_text("print('kmm 2')\n")
    edited = digest(checkout)
    assert edited != first
    (checkout / "src" / "kmm" / "new.py").write_text("")  # untracked, not ignored
    added = digest(checkout)
    assert added != edited

    # Neither an ignored file, nor a file outside the wheel, nor a time.
    (checkout / "src" / "kmm" / "__pycache__").mkdir()
    (checkout / "src" / "kmm" / "__pycache__" / "cli.pyc").write_bytes(b"\0")
    (checkout / "tests" / "test_cli.py").write_text("assert True\n")
    subprocess.run(["touch", "-d", "2001-01-01", str(cli)], check=True, timeout=60)
    assert digest(checkout) == added

    cli.unlink()
    assert digest(checkout) != added
