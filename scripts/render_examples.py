"""Write examples/kmmdemo/src/ into the heredocs of examples/kmmdemo/Dockerfile.

A KMM build has no context but its Dockerfile (a ConfigMap key), so that file
carries the module sources itself, one ``COPY <<'EOF_<NAME>' <name>`` heredoc
per file of src/. The files in src/ are the ones a user reads and edits and
the ones ``make vm-test-modules`` compiles against each VM node kernel; the
heredocs are their copies, rewritten here (the rest of the Dockerfile is
written by hand). ``tests/unit/test_example_kmmdemo.py`` fails while they
differ, as tests/unit/test_docs.py does for the reference pages.

A source may not hold ``$`` or end a line with a backslash: a Dockerfile
parser might expand the one or join lines at the other, and the example's
build must not depend on which parser reads it.

    python scripts/render_examples.py [--out FILE]   # FILE defaults to the Dockerfile
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "kmmdemo"
DOCKERFILE = EXAMPLE / "Dockerfile"
SOURCES = EXAMPLE / "src"

_HEREDOC = re.compile(
    r"^COPY <<'(?P<end>EOF_\w+)' (?P<name>[\w.-]+)\n(?P<body>.*?)^(?P=end)\n", re.M | re.S
)


def delimiter(name: str) -> str:
    """The heredoc delimiter of source ``name``: ``EOF_`` and its name in capitals."""
    return "EOF_" + re.sub(r"\W", "_", name).upper()


def _source(path: pathlib.Path) -> str:
    text = path.read_text()
    if not text.endswith("\n"):
        raise ValueError(f"{path} does not end with a newline")
    for number, line in enumerate(text.splitlines(), 1):
        if "$" in line or line.endswith("\\") or line == delimiter(path.name):
            raise ValueError(
                f"{path}:{number}: a heredoc source may hold no '$', no line ending in "
                f"a backslash and no line {delimiter(path.name)!r}"
            )
    return text


def render(dockerfile: str, sources: pathlib.Path) -> str:
    """``dockerfile`` with each heredoc's body replaced by its source file;
    ValueError when a heredoc names no file, a file has no heredoc, or a
    delimiter is not its file's."""
    names = sorted(p.name for p in sources.iterdir() if p.is_file())
    seen: list[str] = []

    def body(match: re.Match[str]) -> str:
        name, end = match["name"], match["end"]
        if name not in names:
            raise ValueError(f"the Dockerfile's heredoc {name} has no file {sources / name}")
        if end != delimiter(name):
            raise ValueError(f"the heredoc of {name} must end with {delimiter(name)}, not {end}")
        seen.append(name)
        return f"COPY <<'{end}' {name}\n{_source(sources / name)}{end}\n"

    rendered = _HEREDOC.sub(body, dockerfile)
    missing = sorted(set(names) - set(seen))
    if missing:
        raise ValueError(
            f"no heredoc in the Dockerfile for {', '.join(missing)}: add "
            + "; ".join(f"COPY <<'{delimiter(n)}' {n} / {delimiter(n)}" for n in missing)
        )
    return rendered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DOCKERFILE)
    out: pathlib.Path = parser.parse_args().out
    try:
        text = render(DOCKERFILE.read_text(), SOURCES)
    except ValueError as err:
        print(f"render_examples: {err}", file=sys.stderr)
        return 1
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
