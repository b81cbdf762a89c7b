"""Regenerate ``src/kmm/api/unicodenames.py`` from Go's own ``unicode`` package.

Run: ``.venv/bin/python scripts/gen_unicode_names.py [--out FILE]`` (needs
``go``). The names are those Go's ``regexp/syntax`` looks ``\\p{...}`` up in;
``kmm.api.regexps`` resolves names against them so kmm accepts exactly the
classes Go accepts. A unit test regenerates into a temporary file and compares.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOCOMPAT = ROOT / "tests" / "gocompat"
OUT = ROOT / "src" / "kmm" / "api" / "unicodenames.py"


def _tuple(name: str, values: list[str]) -> str:
    lines = "".join(f"    {json.dumps(value)},\n" for value in values)
    return f"{name}: Final = (\n{lines})\n"


def render() -> str:
    found = subprocess.run(
        ["go", "run", ".", "names"], cwd=GOCOMPAT, check=True, capture_output=True, text=True
    )
    tables = json.loads(found.stdout)
    aliases = "".join(
        f"    {json.dumps(k)}: {json.dumps(v)},\n" for k, v in sorted(tables["aliases"].items())
    )
    return (
        '"""The Unicode class names Go\'s ``regexp/syntax`` knows (generated; do not edit).\n'
        "\n"
        "Written by ``scripts/gen_unicode_names.py`` from Go's ``unicode`` package\n"
        "(``Categories``, ``Scripts``, ``CategoryAliases``); a unit test keeps it equal\n"
        "to what the installed Go says.\n"
        '"""\n'
        "\n"
        "from typing import Final\n"
        "\n"
        f"UNICODE_VERSION: Final = {json.dumps(tables['version'])}\n"
        "\n"
        + _tuple("CATEGORIES", tables["categories"])
        + "\n"
        + _tuple("SCRIPTS", tables["scripts"])
        + "\n"
        + f"CATEGORY_ALIASES: Final = {{\n{aliases}}}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(render())


if __name__ == "__main__":
    main()
