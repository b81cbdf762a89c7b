"""Go's own regexp package as a test oracle: builds ``tests/gocompat`` and
asks it, line by line, what Go's ``regexp.Compile`` and ``MatchString`` say.
Go is a prerequisite of this repository (the sandbox is built with it)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from collections.abc import Sequence

SOURCE = pathlib.Path(__file__).resolve().parent / "gocompat"


class GoRegexp:
    """One running ``gocompat`` process."""

    def __init__(self, binary: pathlib.Path) -> None:
        self._process = subprocess.Popen(
            [str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, pattern: str, subjects: Sequence[str] = ()) -> tuple[str | None, list[bool]]:
        """Go's error for ``pattern`` (None if it compiles) and its matches of ``subjects``."""
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(json.dumps({"pattern": pattern, "subjects": list(subjects)}))
        self._process.stdin.write("\n")
        self._process.stdin.flush()
        answer = json.loads(self._process.stdout.readline())
        return answer["error"], answer["matches"]

    def close(self) -> None:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.close()
        self._process.wait(timeout=10)
        self._process.stdout.close()


def build(directory: pathlib.Path) -> pathlib.Path:
    """Build the oracle into ``directory``; fails with a message if Go is missing."""
    go = shutil.which("go")
    assert go is not None, "Go is needed (README: Python >= 3.11 and Go >= 1.26)"
    binary = directory / "gocompat"
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=SOURCE, check=True)
    return binary
