"""Building: a missing toolchain and a failed build are reported clearly; a
built tool is reused from the cache without invoking Go again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kmm.sandbox import building, components, errors


def _tool(directory: Path) -> components.GoTool:
    return components.GoTool(
        name="broken",
        directory=directory,
        required_module="example.com/broken",
        packages=(("broken", "example.com/broken"),),
    )


async def test_missing_go_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(errors.ToolchainMissing, match="install Go"):
        await building.ensure_built(tmp_path / "cache", (components.ETCD,))


async def test_failed_build_names_its_log(tmp_path: Path) -> None:
    module = tmp_path / "module"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.22\n")
    (module / "go.sum").write_text("")
    (module / "main.go").write_text("package main\n\nfunc main() { this is not go }\n")
    tool = _tool(module)
    with pytest.raises(errors.BuildFailed) as caught:
        await building.ensure_built(tmp_path / "cache", (tool,))
    assert caught.value.log_path.is_file()
    assert str(caught.value.log_path) in str(caught.value)
    assert "main.go" in caught.value.log_path.read_text()
    # Nothing half-built is left where a later run would take it as complete.
    assert not building.binary_dir(tmp_path / "cache", tool).exists()


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, bool]] = []

    def started(self, tool: str, total_packages: int) -> None:
        pass

    def advanced(self, tool: str, packages: int) -> None:
        pass

    def finished(self, tool: str, *, cached: bool) -> None:
        self.events.append((tool, cached))


async def test_a_complete_cache_entry_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "module"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.22\n")
    (module / "go.sum").write_text("")
    tool = _tool(module)
    directory = building.binary_dir(tmp_path / "cache", tool)
    directory.mkdir(parents=True)
    binary = directory / "broken"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    # With no Go on PATH, only a cache hit can succeed.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    recorder = _Recorder()
    paths = await building.ensure_built(tmp_path / "cache", (tool,), progress=recorder)
    assert paths == {"broken": binary}
    assert recorder.events == [("broken", True)]
    assert os.access(paths["broken"], os.X_OK)


def test_cache_key_follows_the_modules_own_go_sources(tmp_path: Path) -> None:
    module = tmp_path / "module"
    (module / "cmd").mkdir(parents=True)
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.22\n")
    (module / "go.sum").write_text("")
    (module / "cmd" / "main.go").write_text("package main\n\nfunc main() {}\n")
    before = _tool(module).cache_key
    (module / "cmd" / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert _tool(module).cache_key != before


async def test_kubernetes_binaries_are_stamped_with_the_pinned_version() -> None:
    """What /version and nodeInfo.kubeletVersion report (read from the module
    cache when the pinned module is there; the sandbox build puts it there)."""
    flags = await building._version_ldflags(components.KUBELET)
    assert flags[0] == "-ldflags"
    stamped = dict(item.split("=", 1) for item in flags[1].replace("-X ", "").split())
    version = components.KUBELET.version
    for package in components.KUBERNETES_VERSION_PACKAGES:
        assert stamped[f"{package}.gitVersion"] == version
        assert stamped[f"{package}.gitMajor"] == version[1:].split(".")[0]
        assert stamped[f"{package}.gitMinor"] == version.split(".")[1]
        assert stamped[f"{package}.gitTreeState"] == "clean"
        # Pinned, so whichever module proxy served the module: not every
        # proxy records its origin.
        assert stamped[f"{package}.gitCommit"] == components.KUBERNETES_COMMITS[version]
    assert await building._version_ldflags(components.ETCD) == []
