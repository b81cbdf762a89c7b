"""``scripts/inherited_fds.sh``: mmdebstrap runs with only 0, 1 and 2.

A caller's open descriptors (make's jobserver, a flock's lock) pushed the
pipe mmdebstrap hands to dash's ``cat >&N`` above 9, and dash refused it
("Bad fd number": a cold ``.ci/run`` under flock failed building the image).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_inherits_only_stdin_stdout_and_stderr() -> None:
    script = (
        "source scripts/inherited_fds.sh; exec 5>/dev/null 12>/dev/null; "
        # dash, as mmdebstrap's apt hook runs it: lists its own descriptors.
        "without_inherited_fds sh -c 'ls /proc/$$/fd'"
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert sorted(done.stdout.split(), key=int) == ["0", "1", "2"], done.stdout


def test_every_mmdebstrap_the_scripts_run_goes_through_it() -> None:
    """A run of an mmdebstrap command array (``"${..MMDEBSTRAP[@]}" ...``)
    without the wrapper (the kbuild image's was missed once: the next cold
    run failed there)."""
    run = re.compile(r'^\s*(\w+=\S+\s+)*"\$\{\w*MMDEBSTRAP\[@\]\}"')
    bare = [
        f"{path.name}:{number}"
        for path in sorted((ROOT / "scripts").glob("*.sh"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if run.match(line)
    ]
    wrapped = [
        path.name
        for path in sorted((ROOT / "scripts").glob("*.sh"))
        if "without_inherited_fds" in path.read_text() and path.name != "inherited_fds.sh"
    ]
    assert bare == []
    assert wrapped == ["build_builder_image.sh", "build_image.sh", "build_test_images.sh"]
