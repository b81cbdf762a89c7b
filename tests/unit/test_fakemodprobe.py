"""The modprobe double behaves as kmod's modprobe does where loader hooks rely
on it (each case names the kmod behaviour, from tools/modprobe.c and libkmod)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import fakemodprobe
import pytest

SOFTDEPS = "# KMM's file\nsoftdep a pre: b\nsoftdep b pre: c\n"


@pytest.fixture
def kernel(tmp_path: Path) -> fakemodprobe.Kernel:
    kernel = fakemodprobe.Kernel(tmp_path)
    kernel.provide(["a", "b", "c", "other-mod"], dirname="/opt")
    kernel.configure("softdep.conf", SOFTDEPS)
    return kernel


def _modprobe(kernel: fakemodprobe.Kernel, *args: str) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = fakemodprobe.main([str(kernel.root), *args])
    return code, stderr.getvalue()


def test_insert_loads_pre_softdeps_first_and_params_go_to_the_name(
    kernel: fakemodprobe.Kernel,
) -> None:
    assert _modprobe(kernel, "-v", "-d", "/opt", "a", "x=1") == (0, "")
    assert kernel.events() == ["insmod c", "insmod b", "insmod a x=1"]


def test_insert_of_a_loaded_module_does_nothing_softdeps_included(
    kernel: fakemodprobe.Kernel,
) -> None:
    kernel.load("a")
    assert _modprobe(kernel, "-d", "/opt", "a") == (0, "")
    assert kernel.loaded() == {"a"}
    assert _modprobe(kernel, "--first-time", "-d", "/opt", "a")[0] == 1


def test_insert_fails_for_a_module_not_found_and_skips_a_softdep_not_found(
    kernel: fakemodprobe.Kernel,
) -> None:
    code, stderr = _modprobe(kernel, "-d", "/opt", "nope")
    assert code == 1
    assert "Module nope not found" in stderr
    kernel.configure("more.conf", "softdep other_mod pre: missing\n")
    assert _modprobe(kernel, "-d", "/opt", "other-mod") == (0, "")
    assert kernel.loaded() == {"other_mod"}


def test_remove_takes_the_pre_softdeps_after_the_name(kernel: fakemodprobe.Kernel) -> None:
    for name in "abc":
        kernel.load(name)
    assert _modprobe(kernel, "-rv", "-d", "/opt", "a") == (0, "")
    assert kernel.events() == ["rmmod a", "rmmod b", "rmmod c"]


def test_remove_of_a_name_not_loaded_does_nothing_softdeps_included(
    kernel: fakemodprobe.Kernel,
) -> None:
    kernel.load("b")
    kernel.load("c")
    assert _modprobe(kernel, "-r", "-d", "/opt", "a") == (0, "")
    assert kernel.loaded() == {"b", "c"}
    code, stderr = _modprobe(kernel, "-r", "--first-time", "-d", "/opt", "a")
    assert code == 1
    assert "Module a is not in kernel." in stderr


def test_remove_goes_through_every_name_and_fails_if_one_did(
    kernel: fakemodprobe.Kernel,
) -> None:
    """kmod's rmmod_all: a module in use fails, the names after it are still removed."""
    for name in "abc":
        kernel.load(name, refcnt=1 if name == "a" else 0)
    code, stderr = _modprobe(kernel, "-rva", "-d", "/opt", "a", "b", "c")
    assert code == 1
    assert "Module a is in use." in stderr
    assert kernel.loaded() == {"a"}


def test_a_pre_softdep_in_use_is_left_without_failing(kernel: fakemodprobe.Kernel) -> None:
    for name in "abc":
        kernel.load(name, refcnt=1 if name == "b" else 0)
    code, stderr = _modprobe(kernel, "-r", "-d", "/opt", "a")
    assert code == 0
    assert "Module b is in use." in stderr
    assert kernel.loaded() == {"b", "c"}


def test_configuration_it_does_not_model_is_refused(kernel: fakemodprobe.Kernel) -> None:
    kernel.configure("options.conf", "options a x=1\n")
    with pytest.raises(fakemodprobe.Unsupported):
        _modprobe(kernel, "-d", "/opt", "a")
