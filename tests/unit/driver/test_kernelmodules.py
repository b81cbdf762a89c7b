"""Whether a kernel module is loaded, read from a fake /sys and /proc."""

from __future__ import annotations

import pathlib

import pytest

from kmm.driver import kernelmodules

LIVE = "foo 16384 0 - Live 0x0000000000000000\n"


def _answer(root: pathlib.Path, name: str = "foo") -> str | None:
    return kernelmodules.not_loaded(name, sys_dir=root / "sys", proc_dir=root / "proc")


def _loadable(root: pathlib.Path, *, initstate: str = "live", modules: str | None = LIVE) -> None:
    (root / "sys/module/foo").mkdir(parents=True)
    (root / "sys/module/foo/initstate").write_text(f"{initstate}\n")
    (root / "proc").mkdir()
    if modules is not None:
        (root / "proc/modules").write_text("other 100 1 - Live 0x0\n" + modules)


def test_a_live_module_listed_in_proc_is_loaded(tmp_path: pathlib.Path) -> None:
    _loadable(tmp_path)
    assert _answer(tmp_path) is None


def test_a_module_gone_from_sysfs_is_not_loaded(tmp_path: pathlib.Path) -> None:
    answer = _answer(tmp_path)
    assert answer == f"kernel module foo is not loaded ({tmp_path}/sys/module/foo is gone)"


def test_a_module_proc_does_not_list_is_not_loaded(tmp_path: pathlib.Path) -> None:
    _loadable(tmp_path, modules="")
    assert _answer(tmp_path) == (
        f"kernel module foo is not loaded ({tmp_path}/proc/modules does not list it)"
    )


@pytest.mark.parametrize(
    ("initstate", "modules", "state"),
    [
        ("going", LIVE, "going"),  # rmmod under way
        ("coming", LIVE, "coming"),  # its init has not finished
        ("live", "foo 16384 0 - Unloading 0x0\n", "Unloading"),
    ],
)
def test_a_module_on_its_way_in_or_out_is_not_loaded(
    tmp_path: pathlib.Path, initstate: str, modules: str, state: str
) -> None:
    _loadable(tmp_path, initstate=initstate, modules=modules)
    answer = _answer(tmp_path)
    assert answer is not None
    assert answer.startswith(f"kernel module foo is {state} (")


def test_a_built_in_module_is_loaded_though_proc_never_lists_it(tmp_path: pathlib.Path) -> None:
    # A sysfs entry without initstate: built in, or a sandbox container
    # node's fake module (whose kernel has no /proc/modules at all).
    (tmp_path / "sys/module/foo").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/modules").write_text("other 100 1 - Live 0x0\n")
    assert _answer(tmp_path) is None


def test_without_proc_modules_sysfs_alone_answers(tmp_path: pathlib.Path) -> None:
    _loadable(tmp_path, modules=None)
    assert _answer(tmp_path) is None


def test_names_are_compared_as_the_kernel_shows_them(tmp_path: pathlib.Path) -> None:
    # modprobe takes kmm-ci_a for kmm_ci_a; the kernel shows only the latter.
    (tmp_path / "sys/module/kmm_ci_a").mkdir(parents=True)
    (tmp_path / "sys/module/kmm_ci_a/initstate").write_text("live\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/modules").write_text("kmm_ci_a 100 0 - Live 0x0\n")
    assert _answer(tmp_path, "kmm-ci_a") is None
