"""Whether a kernel module is loaded, as the driver's device health needs it.

The kernel shows a module in two places, and ``not_loaded`` reads both
(under configurable roots, so tests use a fake tree):

- ``<sys>/module/<name>``: present while the module is in the kernel; its
  ``initstate`` (``live``, ``coming``, ``going``) exists only for a loadable
  module, so a directory without one is built in (or, on a sandbox container
  node, a fake module: ``kmm.sandbox.containernodes.fakemodules``);
- ``<proc>/modules``: one line per loadable module, its state in the fifth
  column (``Live``, ``Loading``, ``Unloading``). A kernel without module
  support has no such file, and a built-in module is never listed.

Names are compared as the kernel shows them: kmod's ``-`` is ``_``. This
module only reads files; the health policy (``kmm.driver.kmod``) decides
what an absent module means for its devices.
"""

from __future__ import annotations

import pathlib

__all__ = ["normalized", "not_loaded"]


def normalized(name: str) -> str:
    """A module name as ``/sys/module`` and ``/proc/modules`` show it."""
    return name.replace("-", "_")


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _proc_state(modules: str, name: str) -> str | None:
    """The module's state column in ``/proc/modules``; None when not listed."""
    for line in modules.splitlines():
        fields = line.split()
        if fields and fields[0] == name:
            return fields[4] if len(fields) > 4 else "Live"
    return None


def not_loaded(name: str, *, sys_dir: pathlib.Path, proc_dir: pathlib.Path) -> str | None:
    """Why ``name`` is not loaded, or None while it is."""
    name = normalized(name)
    entry = sys_dir / "module" / name
    if not entry.is_dir():
        return f"kernel module {name} is not loaded ({entry} is gone)"
    initstate = _read(entry / "initstate")
    if initstate is None:
        # Built in (or a sandbox's fake module): it cannot be unloaded, and
        # /proc/modules never lists it, so its absence there says nothing.
        return None
    if initstate.strip() != "live":
        return f"kernel module {name} is {initstate.strip() or 'not live'} ({entry}/initstate)"
    modules = _read(proc_dir / "modules")
    if modules is None:
        return None  # no module support to ask: sysfs alone answers
    state = _proc_state(modules, name)
    if state is None:
        return f"kernel module {name} is not loaded ({proc_dir / 'modules'} does not list it)"
    if state != "Live":
        return f"kernel module {name} is {state} ({proc_dir / 'modules'})"
    return None
