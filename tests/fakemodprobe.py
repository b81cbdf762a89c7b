"""A ``modprobe`` test double with kmod's semantics, for running loader hooks.

The loader pod's ``postStart``/``preStop`` hooks are shell commands that run
kmod's ``modprobe`` in the module image. This machine's kernel has no module
support, so tests run those exact commands with this double first on
``PATH`` (``install``). It keeps its "kernel" in a tree laid out like the real
one, under a root directory:

- ``<root>/proc/sys/kernel/osrelease``: the running kernel (``uname -r``);
- ``<root><dirname>/lib/modules/<kernel>/modules.dep``: the modules it can
  find (``-d <dirname>``, ``/`` by default);
- ``<root>/etc/modprobe.d/*.conf``: configuration. Only ``softdep`` lines and
  comments are understood; any other line is refused, so a test never passes
  on configuration the double ignored;
- ``<root>/sys/module/<name>/{initstate,refcnt}``: a loaded module;
- ``<root>/events``: one ``insmod <name> [params]`` / ``rmmod <name>`` line
  per module actually inserted or removed, in order.

Semantics, read from kmod's ``tools/modprobe.c`` and libkmod (the same from
v9, 2012, to v34; ``man modprobe``, ``man modprobe.d``):

- insert ``modprobe <name> [params]``: a name modprobe cannot find fails; an
  already loaded name succeeds and does nothing (its softdeps are not looked
  at), ``--first-time`` makes that a failure. Otherwise the probe list is
  each ``pre:`` softdep's own probe list, the name, each ``post:`` softdep's
  list, and every entry not yet loaded is inserted in that order; a softdep
  modprobe cannot find is skipped; ``params`` go to the named module only.
  ``-a`` inserts every argument (no params).
- remove ``modprobe -r <name>...``: every name in turn, the exit status 1 if
  any failed. A name not loaded succeeds and does nothing, *including its
  softdeps* (``--first-time``: fails, "not in kernel"). Else: its ``post:``
  softdeps are removed (reverse order, errors ignored); a module in use
  (``refcnt`` > 0) fails; it is removed; then its ``pre:`` softdeps are
  removed the same way (reverse order, errors ignored, each recursively).

Not modelled: hard dependencies (a ``modules.dep`` line with any is refused:
``modulesLoadingOrder`` exists for modules depmod does not relate), aliases,
``install``/``remove``/``options``/``blacklist`` lines, built-in modules, a
module's own ``MODULE_SOFTDEP``. Names are normalized as kmod does (``-`` is
``_``).
"""

from __future__ import annotations

import dataclasses
import getopt
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["Kernel", "Unsupported", "install", "main"]


def _normalize(name: str) -> str:
    return name.replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The double's state under ``root``, for tests to arrange and inspect."""

    root: Path

    def provide(self, names: Iterable[str], *, dirname: str = "/", release: str = "6.1.0") -> None:
        """Make ``names`` findable by ``modprobe -d <dirname>`` on kernel ``release``."""
        osrelease = self.root / "proc/sys/kernel/osrelease"
        osrelease.parent.mkdir(parents=True, exist_ok=True)
        osrelease.write_text(release + "\n")
        modules = self.root / dirname.lstrip("/") / "lib/modules" / release
        modules.mkdir(parents=True, exist_ok=True)
        lines = "".join(f"extra/{name}.ko:\n" for name in names)
        (modules / "modules.dep").write_text(lines)

    def configure(self, name: str, text: str) -> None:
        """Write ``<root>/etc/modprobe.d/<name>``."""
        path = self.root / "etc/modprobe.d" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def load(self, name: str, *, refcnt: int = 0) -> None:
        """Mark ``name`` loaded (as if by an earlier pod), not recorded as an event."""
        module = self.root / "sys/module" / _normalize(name)
        module.mkdir(parents=True, exist_ok=True)
        (module / "initstate").write_text("live\n")
        (module / "refcnt").write_text(f"{refcnt}\n")

    def loaded(self) -> set[str]:
        directory = self.root / "sys/module"
        return {p.name for p in directory.iterdir()} if directory.is_dir() else set()

    def events(self) -> list[str]:
        path = self.root / "events"
        return path.read_text().splitlines() if path.exists() else []


def install(bin_dir: Path, root: Path) -> Path:
    """Write ``bin_dir/modprobe``, running this double on ``root``; return it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "modprobe"
    command = shlex.join([sys.executable, str(Path(__file__).resolve()), str(root)])
    script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    script.chmod(0o755)
    return script


class _Failed(Exception):
    """What real modprobe reports and counts in its exit status."""


class Unsupported(Exception):
    """A setup the double does not model: it stops, the test fails loudly."""


@dataclasses.dataclass
class _Modprobe:
    kernel: Kernel
    dirname: str
    verbose: bool
    quiet: bool
    first_time: bool

    def log(self, message: str) -> None:
        if not self.quiet:
            print(f"modprobe: FATAL: {message}", file=sys.stderr)

    def _modules_dir(self) -> Path:
        release = (self.kernel.root / "proc/sys/kernel/osrelease").read_text().strip()
        return self.kernel.root / self.dirname.lstrip("/") / "lib/modules" / release

    def _available(self) -> dict[str, str]:
        found: dict[str, str] = {}
        path = self._modules_dir() / "modules.dep"
        for line in path.read_text().splitlines() if path.exists() else ():
            module, _, deps = line.partition(":")
            if deps.strip():
                raise Unsupported(f"fake modprobe: hard dependencies are not modelled: {line!r}")
            found[_normalize(Path(module).name.split(".ko")[0])] = module
        return found

    def _softdeps(self, name: str) -> tuple[list[str], list[str]]:
        pre: list[str] = []
        post: list[str] = []
        directory = self.kernel.root / "etc/modprobe.d"
        for conf in sorted(directory.glob("*.conf")) if directory.is_dir() else ():
            for line in conf.read_text().splitlines():
                tokens = line.split()
                if not tokens or tokens[0].startswith("#"):
                    continue
                if tokens[0] != "softdep" or len(tokens) < 3 or tokens[2] not in ("pre:", "post:"):
                    raise Unsupported(f"fake modprobe: {conf.name}: unsupported line {line!r}")
                if _normalize(tokens[1]) != name:
                    continue
                into = pre
                for token in tokens[2:]:
                    if token in ("pre:", "post:"):
                        into = pre if token == "pre:" else post
                    else:
                        into.append(_normalize(token))
        available = self._available()
        return [m for m in pre if m in available], [m for m in post if m in available]

    def _live(self, name: str) -> bool:
        return (self.kernel.root / "sys/module" / name / "initstate").exists()

    def _refcnt(self, name: str) -> int:
        return int((self.kernel.root / "sys/module" / name / "refcnt").read_text())

    def _event(self, line: str) -> None:
        with (self.kernel.root / "events").open("a") as events:
            events.write(line + "\n")

    # -- insert ------------------------------------------------------------

    def _probe_list(self, name: str, visited: set[str], into: list[str]) -> None:
        if name in visited:
            return
        visited.add(name)
        pre, post = self._softdeps(name)
        for dep in pre:
            self._probe_list(dep, visited, into)
        into.append(name)
        for dep in post:
            self._probe_list(dep, visited, into)

    def insert(self, raw: str, params: Sequence[str]) -> None:
        name = _normalize(raw)
        available = self._available()
        if name not in available:
            raise _Failed(f"Module {raw} not found in directory {self._modules_dir()}")
        if self._live(name):
            if self.first_time:
                raise _Failed(f"could not insert '{name}': Module already in kernel")
            return
        probe: list[str] = []
        self._probe_list(name, set(), probe)
        for module in probe:
            if self._live(module):
                continue
            args = list(params) if module == name else []
            if self.verbose:
                print(shlex.join(["insmod", f"/{available[module]}", *args]))
            self.kernel.load(module)
            self._event(shlex.join(["insmod", module, *args]))

    # -- remove ------------------------------------------------------------

    def _remove_list(self, names: Sequence[str]) -> None:
        for name in reversed(names):
            try:
                self.remove_module(name)
            except _Failed as err:
                self.log(str(err))

    def remove_module(self, name: str) -> None:
        pre, post = self._softdeps(name)
        if not self._live(name):
            if self.first_time:
                raise _Failed(f"Module {name} is not in kernel.")
            return
        self._remove_list(post)
        if self._refcnt(name) > 0:
            raise _Failed(f"Module {name} is in use.")
        if self.verbose:
            print(f"rmmod {name}")
        module = self.kernel.root / "sys/module" / name
        for child in module.iterdir():
            child.unlink()
        module.rmdir()
        self._event(f"rmmod {name}")
        self._remove_list(pre)

    def remove(self, raw: str) -> None:
        name = _normalize(raw)
        if name not in self._available():
            raise _Failed(f"Module {raw} not found.")
        self.remove_module(name)


def main(argv: Sequence[str]) -> int:
    """``argv[0]`` is the root, the rest modprobe's arguments."""
    root, *args = argv
    try:
        options, operands = getopt.gnu_getopt(
            args, "varqd:", ["verbose", "all", "remove", "quiet", "dirname=", "first-time"]
        )
    except getopt.GetoptError as err:
        print(f"modprobe: ERROR: {err}", file=sys.stderr)
        return 1
    flags = {flag for flag, _ in options}
    modprobe = _Modprobe(
        kernel=Kernel(Path(root)),
        dirname=next((value for flag, value in options if flag in ("-d", "--dirname")), "/"),
        verbose=bool(flags & {"-v", "--verbose"}),
        quiet=bool(flags & {"-q", "--quiet"}),
        first_time="--first-time" in flags,
    )
    if not operands:
        print("modprobe: ERROR: missing parameters", file=sys.stderr)
        return 1
    failed = False
    if flags & {"-r", "--remove"}:
        for name in operands:
            try:
                modprobe.remove(name)
            except _Failed as err:
                modprobe.log(str(err))
                failed = True
        return 1 if failed else 0
    try:
        if flags & {"-a", "--all"}:
            for name in operands:
                modprobe.insert(name, ())
        else:
            modprobe.insert(operands[0], operands[1:])
    except _Failed as err:
        modprobe.log(str(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
