"""The container nodes' binaries and the registry, as built into the cache:
each reports its pinned version, runc has seccomp, and all are static.

Built like the sandbox's other binaries (``kmm sandbox build`` puts them in
the cache; a missing one is built here, which takes minutes the first time).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kmm.cli import paths
from kmm.sandbox import building, components

_TOOLS = (*components.CONTAINER_NODE, components.REGISTRY)


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    return asyncio.run(building.ensure_built(paths.cache_dir(), _TOOLS))


def _run(path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=60, check=True, env=env
    )
    return done.stdout + done.stderr


def _has_interpreter(path: Path) -> bool:
    """Whether the ELF file asks for a dynamic loader (a PT_INTERP header)."""
    with path.open("rb") as stream:
        header = stream.read(64)
        assert header[:4] == b"\x7fELF"
        assert header[4] == 2  # 64-bit
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        stream.seek(phoff)
        table = stream.read(phentsize * phnum)
    types = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)]
    return 3 in types  # PT_INTERP


def test_containerd_binaries_report_the_pinned_version(binaries: dict[str, Path]) -> None:
    version = components.CONTAINERD.version
    for binary, args in (("containerd", "--version"), ("ctr", "--version")):
        output = _run(binaries[binary], args)
        assert f" {version}" in output, output
        assert "+unknown" not in output, output
    shim = _run(binaries["containerd-shim-runc-v2"], "-v")
    assert f"Version:  {version}" in shim, shim


def test_runc_reports_its_version_and_seccomp(binaries: dict[str, Path]) -> None:
    output = _run(binaries["runc"], "--version")
    assert f"runc version {components.RUNC.version.removeprefix('v')}\n" in output, output
    # Only a runc built with cgo and the seccomp tag links libseccomp.
    assert "libseccomp: 2." in output, output
    features = json.loads(_run(binaries["runc"], "features"))
    assert features["linux"]["seccomp"]["enabled"] is True
    assert "SCMP_ACT_ERRNO" in features["linux"]["seccomp"]["actions"]


def test_kube_proxy_reports_the_kubernetes_pin(binaries: dict[str, Path]) -> None:
    assert _run(binaries["kube-proxy"], "--version").strip() == (
        f"Kubernetes {components.KUBE_PROXY.version}"
    )


def test_registry_reports_the_pinned_version(binaries: dict[str, Path]) -> None:
    output = _run(binaries["registry"], "--version")
    assert f" {components.REGISTRY.version}" in output, output
    assert "+unknown" not in output, output


def test_cni_plugins_report_the_pinned_version(binaries: dict[str, Path]) -> None:
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        # With no CNI_COMMAND a plugin prints what it is and stops.
        output = _run(binaries[plugin], env={})
        assert f"plugin {components.CNI_PLUGINS.version}" in output, output


def test_every_binary_is_static_and_found_first_on_path(binaries: dict[str, Path]) -> None:
    for binary, path in binaries.items():
        assert not _has_interpreter(path), binary
    pinned = building.pinned_dir(paths.cache_dir(), components.CONTAINER_NODE)
    path = building.search_path(pinned, "/usr/sbin:/usr/bin:/sbin:/bin")
    for tool in components.CONTAINER_NODE:
        for binary in tool.binaries:
            found = shutil.which(binary, path=path)
            assert found is not None
            assert Path(found).resolve() == binaries[binary]
