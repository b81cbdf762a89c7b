"""The loader pod's hooks (``loader.scripts``), run as the pod template
carries them against a fake kernel's tree (``tests/fakemodprobe.py``: real
files under ``/sys/module``, ``/proc/modules``, ELF ``.ko`` files with
GNU build-id notes, a ``modprobe`` and ``rmmod`` with kmod's semantics).

Each hook runs under three POSIX shells (``/bin/sh``, ``bash --posix``, and
busybox's ``sh`` with its own ``od``, as in an Alpine or busybox image;
``make test`` installs busybox with its other tools), with
``KMM_LOADER_ROOT`` pointing it at the fake tree. What the kubelet would keep of a
failed hook is the termination-message file, ``<root>/dev/termination-log``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fakemodprobe
import operator_fixtures as fixtures
import pytest

from kmm.api import kernels
from kmm.operator.loader import builders as loader_builders
from kmm.operator.loader import buildids as loader_buildids

KERNEL = "6.1.0-27-amd64"
NAME = "kmod_x"
LOAD = f"modprobe -v -d /opt {NAME} a=1"


SHELLS = ("sh", "bash", "busybox")


def _command(shell: str, script: str) -> list[str]:
    """``shell`` running ``script``, by absolute path (tests narrow PATH)."""
    if shell == "sh":
        return ["/bin/sh", "-c", script]
    found = shutil.which(shell)
    assert found is not None
    return [found, "--posix", "-c", script] if shell == "bash" else [found, "sh", "-c", script]


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# busybox's od is an applet of the shell itself: an image without od is
# one of the others'.
@pytest.fixture(params=[s for s in SHELLS if s != "busybox"])
def shell_without_od(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _hex(name: str, build: str) -> str:
    return fakemodprobe.build_id(name, build).hex()


class Node:
    """One node: the fake kernel, the loader's hooks, the shell they run in."""

    def __init__(
        self,
        tmp_path: Path,
        shell: str,
        *,
        modprobe: dict[str, Any] | None = None,
        in_tree: Sequence[str] = (),
        modular: bool = True,
        names: Sequence[str] = (NAME,),
    ) -> None:
        raw = fixtures.module_raw()
        container = raw["spec"]["moduleLoader"]["container"]
        if modprobe is not None:
            container["modprobe"] = modprobe
        if in_tree:
            container["kernelMappings"][1]["inTreeModulesToRemove"] = list(in_tree)
        module = fixtures.module(raw)
        target = kernels.target(module, KERNEL)
        assert target is not None
        ds = loader_builders.daemonset(module, target)
        self.lifecycle = ds["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
        self.kernel = fakemodprobe.Kernel(tmp_path / "root")
        self.kernel.provide(names, dirname="/opt", release=KERNEL)
        if modular:
            self.kernel.modular()
        order = (modprobe or {}).get("modulesLoadingOrder")
        if order:
            self.kernel.configure("softdep.conf", loader_builders.softdep_config(order))
        self.bin = tmp_path / "bin"
        fakemodprobe.install(self.bin, self.kernel.root)
        self.shell = shell
        self.tools = tmp_path / "tools"
        if shell == "busybox":
            # busybox's own od, rm and cp, as in an Alpine or busybox image.
            self.tools.mkdir()
            for tool in ("od", "rm", "cp"):
                (self.tools / tool).symlink_to(str(shutil.which("busybox")))
        self.report = self.kernel.root / "dev/termination-log"
        self.report.parent.mkdir(parents=True)
        self.report.touch()  # the kubelet makes it, empty, for each container

    def ko(self, name: str = NAME) -> Path:
        return self.kernel.root / f"opt/lib/modules/{KERNEL}/extra/{name}.ko"

    def run(self, hook: str, *, path: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``hook``; ``path``: the whole ``PATH`` (the image's tools),
        after the doubles."""
        script = self.lifecycle[hook]["exec"]["command"]
        assert script[:2] == ["/bin/sh", "-c"]
        command = _command(self.shell, script[2])
        rest = os.environ["PATH"] if path is None else path
        env = {
            **os.environ,
            "PATH": os.pathsep.join(p for p in (str(self.bin), str(self.tools), rest) if p),
            "KMM_LOADER_ROOT": str(self.kernel.root),
        }
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False)

    def restart(self) -> None:
        """The kubelet's next container: a new, empty termination-message file."""
        self.report.write_text("")


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_without_module_support_nothing_is_checked_and_modprobe_runs_as_written(
    tmp_path: Path, shell: str
) -> None:
    """The sandbox's container nodes: no /proc/modules. Nothing can be
    loaded there, so no in-tree module is removed and nothing is compared;
    the hook says so, and runs the load it was given (which the test
    image's modprobe records)."""
    node = Node(tmp_path, shell, modular=False, in_tree=["dummy"])
    out = _ok(node.run("postStart"))
    assert node.kernel.calls() == [LOAD]
    assert node.kernel.events() == [f"insmod {NAME} a=1"]
    assert "in-tree modules dummy: not verifiable, the kernel has no module support" in out
    assert f"{NAME}: not verifiable, the kernel has no module support (no /proc/modules)" in out
    assert node.report.read_text() == ""


def test_a_load_is_checked_against_the_images_build(tmp_path: Path, shell: str) -> None:
    node = Node(tmp_path, shell)
    out = _ok(node.run("postStart"))
    assert node.kernel.calls() == [f"modprobe -D -d /opt {NAME}", LOAD]
    assert node.kernel.events() == [f"insmod {NAME} a=1"]
    assert node.kernel.held_build(NAME) == fakemodprobe.build_note(node.ko().read_bytes())
    assert f"{NAME}: loaded, build {_hex(NAME, 'v1')}, the image's {node.ko()}" in out
    assert node.report.read_text() == ""


def test_another_build_the_kernel_holds_is_unloaded_first(tmp_path: Path, shell: str) -> None:
    """modprobe of a loaded name exits 0 and does nothing: v1 would stay."""
    node = Node(tmp_path, shell)
    node.kernel.load(NAME, build="v0")
    _ok(node.run("postStart"))
    assert node.kernel.events() == [f"rmmod {NAME}", f"insmod {NAME} a=1"]
    assert node.kernel.held_build(NAME) == fakemodprobe.build_note(node.ko().read_bytes())


def test_another_build_in_use_fails_and_is_retried(tmp_path: Path, shell: str) -> None:
    node = Node(tmp_path, shell)
    node.kernel.load(NAME, build="v0", refcnt=1)
    failed = node.run("postStart")
    assert failed.returncode == 1
    assert node.kernel.events() == []
    assert node.report.read_text() == (
        f"unloading {NAME}, loaded before this load (the kernel holds "
        f"build {_hex(NAME, 'v0')}, the image's {node.ko()} is build {_hex(NAME, 'v1')}): "
        f"rmmod: ERROR: Module {NAME} is in use\n"
    )
    # The kubelet runs preStop after a failed postStart: its own failure
    # (v0 in use) does not hide why the load failed.
    why = node.report.read_text()
    assert node.run("preStop").returncode == 1
    assert node.report.read_text() == why
    # The workload let go; the kubelet starts the container again.
    node.restart()
    node.kernel.load(NAME, build="v0", refcnt=0)
    _ok(node.run("postStart"))
    assert node.kernel.events() == [f"rmmod {NAME}", f"insmod {NAME} a=1"]
    assert node.report.read_text() == ""


def test_a_module_modprobe_lists_twice_is_checked_and_reported_once(
    tmp_path: Path, shell: str
) -> None:
    """kmod's ``modprobe -D`` lists a module twice when it is both a softdep
    and a dependency of the one loaded (seen on Debian's kmod with
    kmmdemo_peer: ``softdep kmmdemo_peer pre: kmmdemo`` and modules.dep):
    the stale build it names is unloaded and described once."""
    node = Node(tmp_path, shell)
    node.kernel.load(NAME, build="v0", refcnt=1)
    listing = node.bin / "modprobe"
    fake = node.bin / "modprobe-fake"
    listing.rename(fake)
    listing.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -D ]; then out=$("$0-fake" "$@") || exit; printf "%s\\n%s\\n" "$out" "$out"; exit; fi\n'
        'exec "$0-fake" "$@"\n'
    )
    listing.chmod(0o755)
    failed = node.run("postStart")
    assert failed.returncode == 1
    report = node.report.read_text()
    assert report.count(_hex(NAME, "v0")) == 1, report
    assert report.startswith(f"unloading {NAME}, loaded before this load (the kernel holds")


def test_the_images_build_already_loaded_stays(tmp_path: Path, shell: str) -> None:
    """A restarted loader container finds its own module, in use: kept."""
    node = Node(tmp_path, shell)
    node.kernel.load(NAME, build="v1", refcnt=1)
    out = _ok(node.run("postStart"))
    assert node.kernel.events() == []
    assert f"{NAME}: already loaded, build {_hex(NAME, 'v1')}" in out


def test_the_kernels_refusal_is_the_report(tmp_path: Path, shell: str) -> None:
    node = Node(tmp_path, shell)
    node.kernel.refuse(NAME, "Key was rejected by service")
    failed = node.run("postStart")
    assert failed.returncode == 1
    assert node.report.read_text() == (
        f"{LOAD}: insmod {node.ko()} a=1\n"
        f"modprobe: ERROR: could not insert '{NAME}': Key was rejected by service\n"
    )
    assert node.kernel.loaded() == set()
    _ok(node.run("preStop"))  # nothing to unload; the report stays
    assert "Key was rejected by service" in node.report.read_text()


def test_a_load_that_leaves_another_build_fails(tmp_path: Path, shell: str) -> None:
    node = Node(tmp_path, shell)
    node.kernel.substitute(NAME, "v0")
    assert node.run("postStart").returncode == 1
    assert node.report.read_text() == (
        f"{NAME}: modprobe exited 0, but the kernel holds build {_hex(NAME, 'v0')}, "
        f"the image's {node.ko()} is build {_hex(NAME, 'v1')}\n"
    )


def test_a_built_in_module_of_that_name_fails_the_load(tmp_path: Path, shell: str) -> None:
    node = Node(tmp_path, shell)
    node.kernel.builtin(NAME)
    assert node.run("postStart").returncode == 1
    assert node.report.read_text() == (
        f"{NAME} is built into the kernel: the image's module was not loaded\n"
    )


def test_in_tree_modules_are_removed_by_the_names_the_kernel_holds(
    tmp_path: Path, shell: str
) -> None:
    """``dummy`` came from the node's own tree, which the image's
    modules.dep does not list (``modprobe -r`` would not find it)."""
    node = Node(tmp_path, shell, in_tree=["dummy", "other-mod"])
    node.kernel.load("dummy")
    out = _ok(node.run("postStart"))
    assert node.kernel.calls()[:2] == [f"modprobe -D -d /opt {NAME}", "rmmod dummy"]
    assert node.kernel.events() == ["rmmod dummy", f"insmod {NAME} a=1"]
    assert "in-tree module other_mod: not loaded" in out


@pytest.mark.parametrize(("build", "refcnt", "events"), [
    ("v1", 1, []),
    ("v0", 0, [f"rmmod {NAME}", f"insmod {NAME} a=1"]),
    (None, 0, [f"rmmod {NAME}", f"insmod {NAME} a=1"]),
])  # fmt: skip
def test_an_in_tree_module_of_the_modules_own_name(
    tmp_path: Path, build: str | None, refcnt: int, events: list[str]
) -> None:
    """An out-of-tree module replacing the in-tree one of its name (KMM's
    usual ``inTreeModulesToRemove: [NAME]``): the in-tree build goes, and
    a restarted loader finds the image's own, in use, and keeps it."""
    node = Node(tmp_path, "sh", in_tree=[NAME])
    node.kernel.load(NAME, build=build, refcnt=refcnt)
    out = _ok(node.run("postStart"))
    assert node.kernel.events() == events
    if build == "v1":
        assert f"in-tree module {NAME}: the kernel holds the image's own, kept" in out


@pytest.mark.parametrize(
    ("builtin", "refcnt", "report"),
    [
        (True, 0, "removing the in-tree module dummy: it is built into the kernel and cannot be removed"),
        (False, 1, "removing the in-tree module dummy (rmmod dummy): rmmod: ERROR: Module dummy is in use"),
    ],
)  # fmt: skip
def test_an_in_tree_module_that_stays_fails_the_load(
    tmp_path: Path, builtin: bool, refcnt: int, report: str
) -> None:
    node = Node(tmp_path, "sh", in_tree=["dummy"])
    if builtin:
        node.kernel.builtin("dummy")
    else:
        node.kernel.load("dummy", refcnt=refcnt)
    assert node.run("postStart").returncode == 1
    assert node.report.read_text() == report + "\n"
    assert node.kernel.events() == []


CHAIN = ("kmm_a", "kmm_b", "kmm_c")


@pytest.mark.parametrize(
    ("held", "removed"),
    [
        ({"kmm_c": "v0"}, ["kmm_c"]),
        # kmm_b is the image's build but was loaded after kmm_c: it goes first.
        ({"kmm_b": "v1", "kmm_c": "v0"}, ["kmm_b", "kmm_c"]),
        ({"kmm_a": "v0", "kmm_b": "v1", "kmm_c": "v1"}, ["kmm_a", "kmm_b", "kmm_c"]),
    ],
)
def test_every_module_the_load_inserts_is_checked(
    tmp_path: Path, held: dict[str, str], removed: list[str]
) -> None:
    """With ``modulesLoadingOrder`` (softdeps, as modprobe -D lists them):
    one stale build, and every held module of the list goes, last loaded first."""
    spec = {"moduleName": CHAIN[0], "modulesLoadingOrder": list(CHAIN)}
    node = Node(tmp_path, "sh", modprobe=spec, names=CHAIN)
    for name, build in held.items():
        node.kernel.load(name, build=build)
    out = _ok(node.run("postStart"))
    inserted = [f"insmod {name}" for name in reversed(CHAIN)]
    assert node.kernel.events() == [f"rmmod {name}" for name in removed] + inserted
    for name in CHAIN:
        assert node.kernel.held_build(name) == fakemodprobe.build_note(node.ko(name).read_bytes())
        assert f"{name}: loaded, build {_hex(name, 'v1')}" in out


def test_the_same_chain_already_loaded_stays(tmp_path: Path) -> None:
    spec = {"moduleName": CHAIN[0], "modulesLoadingOrder": list(CHAIN)}
    node = Node(tmp_path, "sh", modprobe=spec, names=CHAIN)
    for name in CHAIN:
        node.kernel.load(name, build="v1")
    _ok(node.run("postStart"))
    assert node.kernel.events() == []


def test_a_held_module_without_the_kernels_note_is_loaded_again(tmp_path: Path, shell: str) -> None:
    """Without the kernel's note the builds cannot be compared: what the
    kernel holds goes, and what modprobe then inserts is the image's file."""
    node = Node(tmp_path, shell)
    node.kernel.load(NAME, build=None)
    out = _ok(node.run("postStart"))
    assert node.kernel.events() == [f"rmmod {NAME}", f"insmod {NAME} a=1"]
    assert f"{NAME}: not verifiable: the kernel shows no build-id of {NAME}" in out
    assert f"{NAME}: loaded, build {_hex(NAME, 'v1')}" in out


def test_a_held_module_with_no_od_in_the_image_is_loaded_again(
    tmp_path: Path, shell_without_od: str
) -> None:
    """Without ``od`` in the image the builds cannot be compared either."""
    node = Node(tmp_path, shell_without_od)
    node.kernel.load(NAME, build="v1")
    out = _ok(node.run("postStart", path=""))
    assert node.kernel.events() == [f"rmmod {NAME}", f"insmod {NAME} a=1"]
    assert f"{NAME}: not verifiable: od is not in the image" in out
    assert f"{NAME}: loaded by this modprobe (it was not loaded before)" in out


def test_raw_args_are_not_checked(tmp_path: Path) -> None:
    spec = {"rawArgs": {"load": ["-v", "-d", "/opt", NAME], "unload": ["-rv", "-d", "/opt", NAME]}}
    node = Node(tmp_path, "sh", modprobe=spec)
    node.kernel.load(NAME, build="v0")
    out = _ok(node.run("postStart"))
    assert node.kernel.calls() == [f"modprobe -v -d /opt {NAME}"]
    assert "rawArgs: which module they load is not kmm's to know" in out


# -- reading ELF files: buildids' kmm_ko_id alone ------------------------------


def _ko_id(tmp_path: Path, shell: str, path: Path, *, tools: str | None = None) -> tuple[str, str]:
    """(build-id, why) of ``path`` as the hook's library reads it."""
    script = (
        loader_buildids.LIBRARY
        + f'\nkmm_ko_id {shlex.quote(str(path))}\nprintf "%s|%s" "$kmm_r" "$kmm_why"\n'
    )
    command = _command(shell, script)
    env = {**os.environ, "KMM_LOADER_ROOT": str(tmp_path)}
    if tools is not None:
        env["PATH"] = tools
    elif shell == "busybox":
        bin_dir = tmp_path / "busybox-bin"
        if not bin_dir.exists():
            bin_dir.mkdir()
            for tool in ("od", "rm", "xz"):
                (bin_dir / tool).symlink_to(str(shutil.which("busybox")))
        env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found, _, why = done.stdout.partition("|")
    return found, why


@pytest.mark.parametrize(("bits", "order"), [(64, "<"), (64, ">"), (32, "<"), (32, ">")])
def test_the_build_id_of_any_elf_layout(tmp_path: Path, shell: str, bits: int, order: str) -> None:
    build = fakemodprobe.build_id("x", "v7")
    path = tmp_path / "x.ko"
    path.write_bytes(fakemodprobe.elf_file(build, bits=bits, order=order))
    assert _ko_id(tmp_path, shell, path) == (build.hex(), "")


def test_the_build_id_of_a_file_ld_made_as_kbuild_does(tmp_path: Path, shell: str) -> None:
    """``ld -r --build-id=sha1``, as Kbuild links a module; checked against readelf."""
    source = tmp_path / "m.c"
    source.write_text("int kmm_value = 3;\nint kmm_f(void) { return kmm_value; }\n")
    subprocess.run(["gcc", "-c", str(source), "-o", str(tmp_path / "m.o")], check=True)
    ko = tmp_path / "m.ko"
    subprocess.run(
        ["ld", "-r", "--build-id=sha1", str(tmp_path / "m.o"), "-o", str(ko)], check=True
    )
    notes = subprocess.run(["readelf", "-n", str(ko)], capture_output=True, text=True, check=True)
    expected = next(
        line.split(":", 1)[1].strip() for line in notes.stdout.splitlines() if "Build ID" in line
    )
    assert _ko_id(tmp_path, shell, ko) == (expected, "")
    assert fakemodprobe.build_note(ko.read_bytes()).endswith(bytes.fromhex(expected))


def test_what_cannot_be_read_says_why(tmp_path: Path, shell: str) -> None:
    text = tmp_path / "text.ko"
    text.write_text("not an ELF file, but long enough to be read as a header ...........\n")
    assert _ko_id(tmp_path, shell, text) == ("", f"{text} is not an ELF file")
    bare = tmp_path / "bare.ko"
    bare.write_bytes(fakemodprobe.elf_file(None))
    assert _ko_id(tmp_path, shell, bare) == ("", f"{bare} has no GNU build-id note")
    other = tmp_path / "x.o"
    other.write_bytes(fakemodprobe.elf_file(b"1234"))
    assert _ko_id(tmp_path, shell, other) == ("", f"{other} is not a .ko file")
    assert _ko_id(tmp_path, shell, bare, tools="") == ("", "od is not in the image")


def test_a_compressed_module_is_read_with_its_decompressor(tmp_path: Path) -> None:
    build = fakemodprobe.build_id("x", "v7")
    plain = tmp_path / "x.ko"
    plain.write_bytes(fakemodprobe.elf_file(build))
    subprocess.run(["xz", "-k", str(plain)], check=True)
    packed = tmp_path / "x.ko.xz"
    assert _ko_id(tmp_path, "sh", packed) == (build.hex(), "")
    od_only = tmp_path / "od-only"
    od_only.mkdir()
    (od_only / "od").symlink_to(str(shutil.which("od")))
    assert _ko_id(tmp_path, "sh", packed, tools=str(od_only)) == (
        "",
        f"{packed} is compressed and xz is not in the image",
    )
