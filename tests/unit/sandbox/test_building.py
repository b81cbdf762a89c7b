"""Building: a missing toolchain and a failed build are reported clearly; a
built tool is reused from the cache without invoking Go again."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
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
        # proxy records its origin. Empty, not a placeholder, when unknown.
        assert stamped[f"{package}.gitCommit"] == components.KUBELET.commit
    assert await building._version_ldflags(components.ETCD) == []


def _module(directory: Path) -> Path:
    """A module whose binary prints what its build chose: a file per build tag
    and per cgo setting, and a variable the version stamp sets."""
    directory.mkdir()
    (directory / "go.mod").write_text("module example.com/probe\n\ngo 1.22\n")
    (directory / "go.sum").write_text("")
    (directory / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nvar stamped = "unstamped"\n\n'
        "func main() { fmt.Println(tag, cgo, stamped) }\n"
    )
    (directory / "tagged.go").write_text(
        '//go:build probetag\n\npackage main\n\nconst tag = "tag"\n'
    )
    (directory / "untagged.go").write_text(
        '//go:build !probetag\n\npackage main\n\nconst tag = "notag"\n'
    )
    (directory / "withcgo.go").write_text(
        '//go:build cgo\n\npackage main\n\nimport "C"\n\nconst cgo = "cgo"\n'
    )
    (directory / "nocgo.go").write_text('//go:build !cgo\n\npackage main\n\nconst cgo = "nocgo"\n')
    return directory


async def _probe(tool: components.GoTool, cache: Path) -> str:
    paths = await building.ensure_built(cache, (tool,))
    process = await asyncio.create_subprocess_exec(
        str(paths["probe"]), stdout=asyncio.subprocess.PIPE
    )
    output, _ = await process.communicate()
    return output.decode().strip()


def _probe_tool(module: Path) -> components.GoTool:
    return components.GoTool(
        name="probe",
        directory=module,
        required_module="example.com/probe",
        packages=(("probe", "example.com/probe"),),
        cgo=False,
    )


async def test_tags_cgo_and_stamps_reach_go_build(tmp_path: Path) -> None:
    plain = _probe_tool(_module(tmp_path / "module"))
    assert await _probe(plain, tmp_path / "cache") == "notag nocgo unstamped"
    chosen = dataclasses.replace(
        plain, tags=("probetag",), cgo=True, stamps=(("main.stamped", "at-{number}"),)
    )
    assert await _probe(chosen, tmp_path / "cache") == "tag cgo at-local"


async def test_a_missing_c_library_names_its_package(tmp_path: Path) -> None:
    tool = dataclasses.replace(
        _probe_tool(_module(tmp_path / "module")),
        cgo=True,
        c_libraries=(("kmm-no-such-library", "libkmm-no-such-library-dev"),),
    )
    with pytest.raises(errors.CHeadersMissing, match="apt-get install libkmm-no-such-library-dev"):
        await building.ensure_built(tmp_path / "cache", (tool,))
    assert not building.binary_dir(tmp_path / "cache", tool).exists()


async def test_without_pkg_config_both_packages_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("go", "gcc"):
        found = shutil.which(program)
        assert found is not None
        (bin_dir / program).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(errors.CHeadersMissing, match="apt-get install pkg-config libseccomp-dev"):
        await building.ensure_built(tmp_path / "cache", (components.RUNC,))


def _fake_entry(cache: Path, tool: components.GoTool) -> None:
    directory = building.binary_dir(cache, tool)
    directory.mkdir(parents=True)
    for binary in tool.binaries:
        path = directory / binary
        path.write_text(f"#!/bin/sh\necho {tool.name}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_pinned_dir_is_found_before_same_named_binaries(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(errors.SandboxError, match="kmm sandbox build"):
        building.pinned_dir(cache, components.CONTAINER_NODE)
    for tool in components.CONTAINER_NODE:
        _fake_entry(cache, tool)
    pinned = building.pinned_dir(cache, components.CONTAINER_NODE)
    assert building.pinned_dir(cache, components.CONTAINER_NODE) == pinned
    assert sorted(path.name for path in pinned.iterdir()) == sorted(
        binary for tool in components.CONTAINER_NODE for binary in tool.binaries
    )
    # A machine's own runc and containerd (Debian's /usr/bin ones) come
    # earlier on the inherited PATH; ours are found all the same.
    system = tmp_path / "usr-bin"
    system.mkdir()
    for name in ("runc", "containerd", "containerd-shim-runc-v2"):
        (system / name).write_text("#!/bin/sh\n")
        (system / name).chmod(0o755)
    path = building.search_path(pinned, f"{system}:{pinned}:/bin")
    assert path == f"{pinned}:{system}:/bin"
    for name in ("runc", "containerd", "containerd-shim-runc-v2", "portmap", "kube-proxy"):
        assert shutil.which(name, path=path) == str(pinned / name)
    assert (pinned / "runc").resolve() == building.binary_dir(cache, components.RUNC) / "runc"


def _finished(directory: Path, binary: str = "broken") -> Path:
    directory.mkdir(parents=True)
    (directory / binary).write_text("#!/bin/sh\n")
    (directory / binary).chmod(0o755)
    return directory


def test_a_build_finishing_second_keeps_the_first_ones_binaries(tmp_path: Path) -> None:
    # Two `kmm sandbox build` runs at once: the first renamed its staging
    # directory into place; the second's rename finds it there, complete.
    target = _finished(tmp_path / "bin")
    staging = _finished(tmp_path / ".broken-x")
    building.publish(staging, target, _tool(tmp_path))
    assert (target / "broken").read_text() == "#!/bin/sh\n"


def test_a_rename_over_an_incomplete_directory_still_fails(tmp_path: Path) -> None:
    target = tmp_path / "bin"
    (target / "leftover").mkdir(parents=True)
    staging = _finished(tmp_path / ".broken-x")
    with pytest.raises(OSError, match="not empty"):
        building.publish(staging, target, _tool(tmp_path))
