"""Build the sandbox binaries from the pinned Go modules, once per version.

Binaries land in ``<cache>/<tool>-<version>-<digest>/bin`` and are reused by
every later start; a build goes to a temporary directory first and is renamed
into place, so an interrupted build never leaves a half-filled cache entry.
``go build -v`` names each package it compiles, which is what the progress
callback counts against the package total from ``go list -deps``.

A tool's build tags, cgo setting, environment and linker flags
(``components.GoTool``) go to both ``go list`` and ``go build``; a tool that
needs C libraries through cgo has them checked with ``pkg-config`` first, so a
missing one is named with the Debian package to install.

``pinned_dir`` gathers the binaries of several tools into one directory, to be
put first on the PATH of whatever starts them: the container nodes' containerd
finds its shim, and the shim finds runc, by PATH, and Debian's own (too old)
containerd and runc may sit in /usr/bin.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from kmm.sandbox import components, errors

__all__ = [
    "BuildProgress",
    "binary_dir",
    "ensure_built",
    "go_binary",
    "pinned_dir",
    "search_path",
]


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


def publish(staging: Path, target: Path, tool: components.GoTool) -> None:
    """Rename a finished build into place. Two builds of one tool may run at
    once (two worktrees, `make test` beside a helper's run): the one renaming
    second finds ``target`` complete and keeps it, rather than failing a
    build that produced the same thing."""
    try:
        staging.rename(target)
    except OSError:
        if not _is_complete(target, tool):
            raise


def _environment(tool: components.GoTool) -> dict[str, str]:
    """The environment of the tool's ``go list`` and ``go build``."""
    env = dict(os.environ)
    if tool.cgo is not None:
        env["CGO_ENABLED"] = "1" if tool.cgo else "0"
    env.update(dict(tool.env))
    return env


def _flags(tool: components.GoTool) -> list[str]:
    return ["-tags", ",".join(tool.tags)] if tool.tags else []


async def _check_c_libraries(tool: components.GoTool) -> None:
    """Name the Debian packages whose C headers cgo will miss, before Go
    fails on them with a compiler error."""
    if not tool.cgo or not tool.c_libraries:
        return
    compiler = _environment(tool).get("CC", "gcc")
    if shutil.which(compiler) is None:
        raise errors.CHeadersMissing(tool.name, f"a C compiler (`{compiler}`)", ("gcc",))
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        packages = ("pkg-config", *(package for _, package in tool.c_libraries))
        raise errors.CHeadersMissing(tool.name, "pkg-config", packages)
    for library, package in tool.c_libraries:
        code, _ = await _run([pkg_config, "--exists", library], cwd=tool.directory)
        if code != 0:
            raise errors.CHeadersMissing(tool.name, f"the C library {library}", (package,))


async def _run(
    argv: list[str], *, cwd: Path, log: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, bytes]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
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
    A tool with a single version variable gets just that one; a tool with
    stamps gets each variable set to its template filled in."""
    if tool.version_variable:
        return ["-ldflags", f"-X {tool.version_variable}={tool.version}"]
    if tool.stamps:
        values = {"version": tool.version, "number": tool.version.removeprefix("v")}
        stamped = [f"-X {variable}={value.format(**values)}" for variable, value in tool.stamps]
        return ["-ldflags", " ".join(stamped)]
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
    # gitCommit is stamped even when not known: empty, not the source's
    # "$Format:%H$" placeholder.
    flags = [
        f"-X {package}.{name}={value}"
        for package in tool.version_packages
        for name, value in values.items()
        if value or name == "gitCommit"
    ]
    return ["-ldflags", " ".join(flags)]


async def _ldflags(tool: components.GoTool) -> list[str]:
    """The version stamps and the tool's own linker flags, as one -ldflags."""
    version = await _version_ldflags(tool)
    flags = [*version[1:], *tool.ldflags]
    return ["-ldflags", " ".join(flags)] if flags else []


async def _build(tool: components.GoTool, target: Path, log: Path, progress: BuildProgress) -> None:
    go = go_binary()
    await _check_c_libraries(tool)
    env = _environment(tool)
    flags = _flags(tool)
    packages = [package for _, package in tool.packages]
    code, listing = await _run(
        [go, "list", *flags, "-deps", *packages], cwd=tool.directory, env=env
    )
    if code != 0:
        log.write_bytes(listing)
        raise errors.BuildFailed(tool.name, log)
    total = len(listing.splitlines())
    progress.started(tool.name, total)

    ldflags = await _ldflags(tool)
    staging = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=target.parent))
    try:
        with log.open("wb") as stream:
            settings = json.dumps(tool.build_settings, sort_keys=True)
            stream.write(f"$ go build -v -trimpath ({tool.directory}) {settings}\n".encode())
        # One `go build` per binary: `-o DIR` with several main packages works,
        # but building them one by one keeps the log readable per binary.
        for binary, package in tool.packages:
            process = await asyncio.create_subprocess_exec(
                go,
                "build",
                "-v",
                "-trimpath",
                *flags,
                *ldflags,
                "-o",
                str(staging / binary),
                package,
                cwd=tool.directory,
                env=env,
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
        publish(staging, target, tool)
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


def pinned_dir(cache_dir: Path, tools: tuple[components.GoTool, ...]) -> Path:
    """One directory with a link to every binary of ``tools`` (built already:
    ``ensure_built`` first), to put first on PATH so that these binaries, and
    never a same-named one elsewhere (Debian's /usr/bin/runc), are found.

    ``<cache>/sandbox/pinned-<digest of the tools' cache keys>/bin``: a new
    pin makes a new directory, and one made is never changed."""
    digest = hashlib.sha256("\n".join(tool.cache_key for tool in tools).encode())
    target = cache_dir / "sandbox" / f"pinned-{digest.hexdigest()[:12]}" / "bin"
    if target.is_dir():
        return target
    missing = [tool.name for tool in tools if not _is_complete(binary_dir(cache_dir, tool), tool)]
    if missing:
        raise errors.SandboxError(
            f"{', '.join(missing)} not built yet; run `kmm sandbox build` and try again."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pinned-", dir=target.parent))
    try:
        for tool in tools:
            for binary in tool.binaries:
                (staging / binary).symlink_to(binary_dir(cache_dir, tool) / binary)
        with contextlib.suppress(OSError):
            staging.rename(target)  # fails when a concurrent caller made it first
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not target.is_dir():
        raise errors.SandboxError(f"could not create {target}; check the cache's permissions.")
    return target


def search_path(pinned: Path, inherited: str | None = None) -> str:
    """A PATH with ``pinned`` first, then ``inherited`` (this process's PATH
    by default) without any entry for ``pinned`` again."""
    rest = os.environ.get("PATH", "") if inherited is None else inherited
    entries = [entry for entry in rest.split(os.pathsep) if entry and Path(entry) != pinned]
    return os.pathsep.join([str(pinned), *entries])
