"""Regenerate the kubelet-plugin gRPC stubs from ``proto/``.

Run with the pinned dev tools: ``.venv/bin/python scripts/gen_protos.py``
(or ``make protos``). Output goes to ``src/kmm/kubeletplugin/protos``;
``--out DIR`` writes elsewhere (the regeneration test compares the two).

grpcio-tools writes top-level imports (``import dra_v1_pb2``) into the
``_grpc`` modules; they are rewritten to package imports so the stubs live
inside ``kmm.kubeletplugin.protos`` without touching ``sys.path``.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "src" / "kmm" / "kubeletplugin" / "protos"
# mypy-protobuf's plugins sit beside the interpreter running this script.
BIN = pathlib.Path(sys.executable).parent
PACKAGE = "kmm.kubeletplugin.protos"
INIT = '"""Generated gRPC stubs (scripts/gen_protos.py); do not edit."""\n'


def generate(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *protos,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    stems = [name.removesuffix(".proto") for name in protos]
    for path in sorted(out.glob("*_grpc.py*")):
        text = path.read_text()
        for stem in stems:
            text = re.sub(
                rf"^import {stem}_pb2\b",
                f"from {PACKAGE} import {stem}_pb2",
                text,
                flags=re.MULTILINE,
            )
        path.write_text(text)
    (out / "__init__.py").write_text(INIT)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    generate(args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
