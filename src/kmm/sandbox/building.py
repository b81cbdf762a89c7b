"""Build the sandbox binaries from the pinned Go modules, once per version.

Binaries land in ``<cache>/<tool>-<version>-<digest>/bin`` and are reused by
every later start; a build goes to a temporary directory first and is renamed
into place, so an interrupted build never leaves a half-filled cache entry.
``go build -v`` names each package it compiles, which is what the progress
callback counts against the package total from ``go list -deps``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from kmm.sandbox import components, errors

__all__ = ["BuildProgress", "binary_dir", "ensure_built", "go_binary"]


class BuildProgress(Protocol):
    """Receives build progress; the CLI draws it, tests ignore it."""

    def started(self, tool: str, total_packages: int) -> None: ...

    def advanced(self, tool: str, packages: int) -> None: ...

    def finished(self, tool: str, *, cached: bool) -> None: ...


class _Silent:
    def started(self, tool: str, total_packages: int) -> None:
        pass

    def advanced(self, tool: str, packages: int) -> None:
        pass

    def finished(self, tool: str, *, cached: bool) -> None:
        pass


def go_binary() -> str:
    """The ``go`` executable, or a clear error saying how to get one."""
    found = shutil.which("go")
    if found is None:
        raise errors.ToolchainMissing("no `go` executable on PATH")
    return found


def binary_dir(cache_dir: Path, tool: components.GoTool) -> Path:
    return cache_dir / "sandbox" / tool.cache_key / "bin"


def _is_complete(directory: Path, tool: components.GoTool) -> bool:
    return all(os.access(directory / binary, os.X_OK) for binary in tool.binaries)


async def _run(argv: list[str], *, cwd: Path, log: Path | None = None) -> tuple[int, bytes]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    output = await process.stdout.read()
    code = await process.wait()
    if log is not None:
        with log.open("ab") as stream:
            stream.write(output)
    return code, output


async def _version_ldflags(tool: components.GoTool) -> list[str]:
    """``-ldflags`` stamping the Kubernetes version variables as the Kubernetes
    build does (gitVersion, gitMajor, gitMinor, gitCommit, gitTreeState,
    buildDate), from the pinned module's version, its pinned commit (or the
    origin the module proxy records for it) and its publication time;
    without them /version says ``v0.0.0-master``.
    A tool with a single version variable gets just that one."""
    if tool.version_variable:
        return ["-ldflags", f"-X {tool.version_variable}={tool.version}"]
    if not tool.version_packages:
        return []
    version = tool.version
    process = await asyncio.create_subprocess_exec(
        go_binary(), "mod", "download", "-json", f"{tool.required_module}@{version}",
        cwd=tool.directory, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    output, _ = await process.communicate()
    code = process.returncode
    try:
        found = json.loads(output) if code == 0 else {}
    except json.JSONDecodeError:
        found = {}
    commit = tool.commit or (found.get("Origin") or {}).get("Hash", "")
    build_date = ""
    if found.get("Info"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            build_date = json.loads(Path(found["Info"]).read_text()).get("Time", "")
    match = re.match(r"^v(\d+)\.(\d+)", version)
    major, minor = match.groups() if match else ("", "")
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": commit,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = [
        f"-X {package}.{name}={value}"
        for package in tool.version_packages
        for name, value in values.items()
        if value
    ]
    return ["-ldflags", " ".join(flags)]


async def _build(tool: components.GoTool, target: Path, log: Path, progress: BuildProgress) -> None:
    go = go_binary()
    packages = [package for _, package in tool.packages]
    code, listing = await _run([go, "list", "-deps", *packages], cwd=tool.directory, log=None)
    if code != 0:
        log.write_bytes(listing)
        raise errors.BuildFailed(tool.name, log)
    total = len(listing.splitlines())
    progress.started(tool.name, total)

    ldflags = await _version_ldflags(tool)
    staging = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=target.parent))
    try:
        with log.open("wb") as stream:
            stream.write(f"$ go build -v -trimpath ({tool.directory})\n".encode())
        # One `go build` per binary: `-o DIR` with several main packages works,
        # but building them one by one keeps the log readable per binary.
        for binary, package in tool.packages:
            process = await asyncio.create_subprocess_exec(
                go,
                "build",
                "-v",
                "-trimpath",
                *ldflags,
                "-o",
                str(staging / binary),
                package,
                cwd=tool.directory,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            assert process.stdout is not None
            with log.open("ab") as stream:
                async for line in process.stdout:
                    stream.write(line)
                    if not line.startswith(b"#"):
                        progress.advanced(tool.name, 1)
            if await process.wait() != 0:
                raise errors.BuildFailed(tool.name, log)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


async def ensure_built(
    cache_dir: Path,
    tools: tuple[components.GoTool, ...] = components.ALL,
    *,
    progress: BuildProgress | None = None,
) -> dict[str, Path]:
    """Return the path of every binary of ``tools``, building what is missing."""
    reporter = progress or _Silent()
    paths: dict[str, Path] = {}
    for tool in tools:
        directory = binary_dir(cache_dir, tool)
        if not _is_complete(directory, tool):
            directory.parent.mkdir(parents=True, exist_ok=True)
            if directory.exists():
                shutil.rmtree(directory)
            await _build(tool, directory, directory.parent / "build.log", reporter)
            reporter.finished(tool.name, cached=False)
        else:
            reporter.finished(tool.name, cached=True)
        for binary in tool.binaries:
            paths[binary] = directory / binary
    return paths
