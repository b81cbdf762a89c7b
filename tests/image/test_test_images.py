"""The container-node tests' images, as `make test-images` wrote them.

Each archive is opened and unpacked as a runtime would; its files are
checked, and its programs run on this machine under chroot in the unpacked
root filesystem, so it is the image's own busybox that runs them and the
image's own paths they see (``/proc`` is not mounted there: the loader's
``/proc/1/fd/1`` is a plain file the test reads). The workload's entrypoint
runs as PID 1 of a PID namespace of its own (``unshare --pid``, gone when it
exits), as in a container. Needs root, as the image test does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
from pathlib import Path

import imagearchives
import pytest

IMAGES = imagearchives.BUILD / "images"
FILES = imagearchives.ROOT / "scripts" / "test_images"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# ELF program header type of the dynamic loader's path: a static binary has none.
PT_INTERP = 3


def _image(name: str, into: Path) -> tuple[imagearchives.Image, Path]:
    archive = imagearchives.required(IMAGES / f"{name}.tar", target="test-images")
    image = imagearchives.open_image(archive, into / "layout")
    rootfs = imagearchives.unpack(image, into / "rootfs")
    # The image carries the work tree's files, or it is an older build.
    here = FILES / name
    for source in here.rglob("*") if here.is_dir() else ():
        if source.is_file():
            inside = rootfs / source.relative_to(here)
            if not inside.is_file() or inside.read_bytes() != source.read_bytes():
                pytest.fail(
                    f"{archive} is stale: its /{source.relative_to(here)} is not {source}: "
                    "run `make test-images` (make test does) before pytest"
                )
    return image, rootfs


def _runtime_devices(rootfs: Path) -> None:
    """The /dev/null a runtime gives every container (the scripts redirect to it)."""
    os.mknod(rootfs / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(rootfs / "dev" / "null", 0o666)


def _resolves_inside(rootfs: Path, link: Path) -> Path:
    """Where a link of the image leads, resolved in the image, never outside it."""
    target = os.readlink(link)
    assert not os.path.isabs(target), f"{link} -> {target}"
    resolved = (link.parent / target).resolve()
    assert resolved.is_relative_to(rootfs.resolve()), f"{link} -> {target}"
    return resolved


def _busybox_links(rootfs: Path) -> dict[str, Path]:
    """Every link in the image's bin directories, resolved: busybox's applets."""
    busybox = (rootfs / "bin" / "busybox").resolve()
    found = [*rootfs.glob("*bin/*"), *rootfs.glob("usr/*bin/*")]
    links = {path.name: _resolves_inside(rootfs, path) for path in found if path.is_symlink()}
    assert links["sh"] == busybox
    for applet in ("sleep", "cp", "awk", "find", "sort", "stat", "env", "sed"):
        assert links[applet] == busybox, applet
    return links


def test_the_archives_name_their_images_as_the_readme_says(tmp_path: Path) -> None:
    expected = {
        "loader": "kmm.sandbox/loader:1",
        "workload": "kmm.sandbox/workload:1",
        "pause": "kmm.sandbox/pause:3.10",
    }
    for name, reference in expected.items():
        archive = imagearchives.required(IMAGES / f"{name}.tar", target="test-images")
        image = imagearchives.open_image(archive, tmp_path / name)
        assert image.reference == reference
        assert image.config["os"] == "linux"
        assert len(image.layers) == 1


def test_the_loader_records_each_modprobe_call_in_its_main_process_log(tmp_path: Path) -> None:
    image, rootfs = _image("loader", tmp_path)
    assert image.config["config"]["Cmd"] == ["sleep", "infinity"]
    modprobe = rootfs / "usr" / "sbin" / "modprobe"
    assert modprobe.is_file()
    assert os.access(modprobe, os.X_OK)
    links = _busybox_links(rootfs)
    # The busybox applet would try the kernel: every modprobe is the recorder.
    assert links["modprobe"] == modprobe.resolve()
    assert _resolves_inside(rootfs, rootfs / "sbin" / "modprobe") == modprobe.resolve()
    assert (rootfs / "firmware" / "kmm-test" / "fw.bin").read_bytes() == b"kmm-test firmware 1\n"

    # What the loader's hooks would find: a modprobe.d file (the softdeps the
    # pod mounts), the main process's stdout, the log file's directory.
    softdep = 'softdep a pre: b\n# "quoted"\\ and\ttabbed\n'
    (rootfs / "etc" / "modprobe.d" / "softdep.conf").write_text(softdep)
    _runtime_devices(rootfs)
    stdout = rootfs / "proc" / "1" / "fd" / "1"
    stdout.parent.mkdir(parents=True)
    stdout.write_text("")
    calls = [["-v", "-d", "/opt", "kmm_ci_a", "x=1 y"], ["-rv", "-d", "/opt", "kmm_ci_a"]]
    for argv in calls:
        # Through /bin/sh -c, as the hooks run it.
        done = subprocess.run(
            [CHROOT, str(rootfs), "/bin/sh", "-c", 'modprobe "$@"', "sh", *argv],
            env={"PATH": PATH},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == ""
    expected = [
        {"argv": argv, "modprobe.d": {"/etc/modprobe.d/softdep.conf": softdep}} for argv in calls
    ]
    for log in (stdout, rootfs / "var" / "log" / "kmm-modprobe.log"):
        lines = log.read_text().splitlines()
        assert all(line.startswith("KMM-MODPROBE {") for line in lines), lines
        assert [json.loads(line.removeprefix("KMM-MODPROBE ")) for line in lines] == expected


def _children(pid: int) -> list[int]:
    try:
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except FileNotFoundError:
        return []


def test_the_workload_says_what_it_was_given_and_stops_on_sigterm_as_pid_1(
    tmp_path: Path,
) -> None:
    image, rootfs = _image("workload", tmp_path)
    settings = image.config["config"]
    assert settings["Entrypoint"] == ["/entrypoint"]
    assert settings["User"] == "65532:65532"
    _busybox_links(rootfs)
    # A device node as a CDI spec would give it (major 1, minor 3: /dev/null's).
    _runtime_devices(rootfs)
    os.mknod(rootfs / "dev" / "kmm-test0", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    argv = [
        *(UNSHARE, "--pid", "--fork", "--kill-child"),
        *(CHROOT, f"--userspec={settings['User']}", str(rootfs), *settings["Entrypoint"]),
    ]
    environment = {"PATH": PATH, "KMM_DEVICE": "kmm-test0", "A_FIRST": "1"}
    with subprocess.Popen(argv, env=environment, stdout=subprocess.PIPE, text=True) as process:
        try:
            lines = _until_ready(process)
            (pid_1,) = _children(process.pid)
            # PID 1 of its namespace: a signal it has no handler for would be
            # ignored, and it would sleep on until killed.
            (nspids,) = [
                line
                for line in Path(f"/proc/{pid_1}/status").read_text().splitlines()
                if line.startswith("NSpid:")
            ]
            assert nspids.split()[-1] == "1"
            os.kill(pid_1, signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            # Its PID 1 first: the namespace goes with it. (--kill-child does
            # not outlive chroot's change of user.)
            for child in _children(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            process.kill()
    devices = [line for line in lines if line.startswith("KMM-WORKLOAD device ")]
    printed = [line.removeprefix("KMM-WORKLOAD env ") for line in lines[len(devices) : -1]]
    assert devices == [
        "KMM-WORKLOAD device /dev/kmm-test0 c 1:3",
        "KMM-WORKLOAD device /dev/null c 1:3",
    ]
    assert printed == sorted(printed)
    assert {"A_FIRST=1", "KMM_DEVICE=kmm-test0"} <= set(printed)


def _until_ready(process: subprocess.Popen[str]) -> list[str]:
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if line == "KMM-WORKLOAD ready\n":
            return lines
    raise AssertionError(f"the workload stopped before it was ready: {lines}")


def test_pause_is_static_and_the_images_entrypoint(tmp_path: Path) -> None:
    image, rootfs = _image("pause", tmp_path)
    settings = image.config["config"]
    assert settings["Entrypoint"] == ["/pause"]
    assert settings["User"] == "65535:65535"
    binary = rootfs / "pause"
    data = binary.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert data[4] == 2  # ELFCLASS64
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    assert types, "no program headers"
    assert PT_INTERP not in types
    # It runs here, with no loader, and says which pause.c it is.
    done = subprocess.run([str(binary), "-v"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pause.c v3.10"), done.stdout
