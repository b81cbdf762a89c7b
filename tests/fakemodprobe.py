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
- ``<root><dirname>/lib/modules/<kernel>/extra/<name>.ko``: each one an ELF
  file (``elf_file``) with a GNU build-id note, the image's build;
- ``<root>/proc/modules``: present when the kernel has module support
  (``modular``); a kernel without it (this machine's) has none;
- ``<root>/sys/module/<name>/{initstate,refcnt}``: a loaded module, and
  ``notes/.note.gnu.build-id``, the build-id note of the file inserted
  (the kernel's copy of the ``.ko``'s section); a directory without
  ``initstate``: a built-in module;
- ``<root>/refused/<name>``: the kernel's answer to an insert of ``name``
  (``refuse``), which fails;
- ``<root>/substituted/<name>``: the build-id note the kernel shows once
  ``name`` is inserted, whatever the file's (``substitute``);
- ``<root>/events``: one ``insmod <name> [params]`` / ``rmmod <name>`` line
  per module actually inserted or removed, in order;
- ``<root>/calls``: one line per ``modprobe``/``rmmod`` run, its arguments.

``rmmod`` (``install`` writes it too) is kmod's: it removes a name the
kernel holds, whatever tree it came from, and fails for a name not loaded,
built in, or in use.

Semantics, read from kmod's ``tools/modprobe.c`` and libkmod (the same from
v9, 2012, to v34; ``man modprobe``, ``man modprobe.d``):

- insert ``modprobe <name> [params]``: a name modprobe cannot find fails; an
  already loaded name succeeds and does nothing (its softdeps are not looked
  at), ``--first-time`` makes that a failure. Otherwise the probe list is
  each ``pre:`` softdep's own probe list, the name, each ``post:`` softdep's
  list, and every entry not yet loaded is inserted in that order; a softdep
  modprobe cannot find is skipped; ``params`` go to the named module only.
  ``-a`` inserts every argument (no params).
- ``modprobe -D <name>`` (``--show-depends``): the insert's probe list as
  ``insmod <file> [params]`` lines, loaded modules included, nothing done.
- remove ``modprobe -r <name>...``: every name in turn, the exit status 1 if
  any failed. A name not loaded succeeds and does nothing, *including its
  softdeps* (``--first-time``: fails, "not in kernel"). Else: its ``post:``
  softdeps are removed (reverse order, errors ignored); a module in use
  (``refcnt`` > 0) fails; it is removed; then its ``pre:`` softdeps are
  removed the same way (reverse order, errors ignored, each recursively).

Not modelled: hard dependencies (a ``modules.dep`` line with any is refused:
``modulesLoadingOrder`` exists for modules depmod does not relate), aliases,
``install``/``remove``/``options``/``blacklist`` lines, a module's own
``MODULE_SOFTDEP``; of built-in modules, only that an insert of one does
nothing and ``rmmod`` refuses it. Names are normalized as kmod does (``-`` is
``_``).
"""

from __future__ import annotations

import dataclasses
import getopt
import hashlib
import shlex
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["Kernel", "Unsupported", "build_id", "elf_file", "install", "main", "rmmod_main"]

NT_GNU_BUILD_ID = 3
SHT_NOTE = 7


def _note(name: bytes, type_: int, desc: bytes, order: str) -> bytes:
    def padded(data: bytes) -> bytes:
        return data + b"\0" * (-len(data) % 4)

    return struct.pack(f"{order}III", len(name), len(desc), type_) + padded(name) + padded(desc)


def elf_file(
    build: bytes | None, *, bits: int = 64, order: str = "<", other_notes: bool = True
) -> bytes:
    """A relocatable ELF file as ``ld -r --build-id`` makes a ``.ko``: a
    ``.note.gnu.build-id`` section holding ``build`` (none if None), after
    ``.note.Linux`` and ``.note.gnu.property`` notes of other types (as a
    module has: a reader must pick the right one), and ``.shstrtab``.
    ``bits`` 32 or 64, ``order`` ``<`` (little-endian) or ``>``."""
    sections: list[tuple[bytes, int, bytes]] = []  # (name, type, data)
    if other_notes:
        sections.append((b".note.Linux", SHT_NOTE, _note(b"Linux\0", 0x100, b"\x06\x01", order)))
        sections.append((b".note.gnu.property", SHT_NOTE, _note(b"GNU\0", 5, b"\0" * 16, order)))
    if build is not None:
        sections.append(
            (b".note.gnu.build-id", SHT_NOTE, _note(b"GNU\0", NT_GNU_BUILD_ID, build, order))
        )
    sections.append((b".text", 1, b"\xc3" * 7))
    names = b"\0" + b"".join(name + b"\0" for name, _, _ in sections) + b".shstrtab\0"
    sections.append((b".shstrtab", 3, names))
    header_size, entry_size = (64, 64) if bits == 64 else (52, 40)
    body = b""
    placed: list[tuple[int, int, int, int]] = []  # (name offset, type, offset, size)
    name_at = 1
    for name, type_, data in sections:
        at = len(names) - len(b".shstrtab\0") if name == b".shstrtab" else name_at
        placed.append((at, type_, header_size + len(body), len(data)))
        name_at += len(name) + 1
        body += data + b"\0" * (-len(data) % 8)
    shoff = header_size + len(body)
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 1 if order == "<" else 2, 1]) + b"\0" * 9
    count = len(placed) + 1
    # e_type ET_REL, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags,
    # e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx.
    fields = (1, 62 if bits == 64 else 3, 1, 0, 0, shoff, 0, header_size, 0, 0, entry_size)
    word, address = ("Q", "Q") if bits == 64 else ("I", "I")
    header = ident + struct.pack(
        f"{order}HHI{address}{address}{word}IHHHHHH", *fields, count, count - 1
    )
    # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link,
    # sh_info, sh_addralign, sh_entsize.
    layout = f"{order}II{word}{address}{word}{word}II{word}{word}"
    entries = [b"\0" * entry_size] + [
        struct.pack(layout, n, t, 0, 0, o, z, 0, 0, 4, 0) for n, t, o, z in placed
    ]
    return header + body + b"".join(entries)


def build_note(data: bytes) -> bytes:
    """The ``.note.gnu.build-id`` section of the ELF file ``data`` (as the
    kernel shows it in ``/sys/module/NAME/notes``); b"" if it has none."""
    order = "<" if data[5] == 1 else ">"
    if data[4] == 2:
        (shoff,) = struct.unpack_from(f"{order}Q", data, 0x28)
        entry_size, count = struct.unpack_from(f"{order}HH", data, 0x3A)
        layout, fields = f"{order}IIQQQQ", (1, 4, 5)
    else:
        (shoff,) = struct.unpack_from(f"{order}I", data, 0x20)
        entry_size, count = struct.unpack_from(f"{order}HH", data, 0x2E)
        layout, fields = f"{order}IIIIII", (1, 4, 5)
    for index in range(count):
        entry = struct.unpack_from(layout, data, shoff + index * entry_size)
        type_, offset, size = (entry[i] for i in fields)
        if type_ != SHT_NOTE:
            continue
        section = data[offset : offset + size]
        position = 0
        while position + 12 <= len(section):
            name_size, desc_size, note_type = struct.unpack_from(f"{order}III", section, position)
            name_at = position + 12
            desc_at = name_at + (name_size + 3) // 4 * 4
            end = desc_at + (desc_size + 3) // 4 * 4
            if note_type == NT_GNU_BUILD_ID and section[name_at : name_at + name_size] == b"GNU\0":
                return section[position:end]
            position = end
    return b""


def build_id(name: str, build: str = "v1") -> bytes:
    """A 20-byte build-id (as ``--build-id=sha1`` makes) for ``build`` of ``name``."""
    return hashlib.sha1(f"{name} {build}".encode()).digest()


def _normalize(name: str) -> str:
    return name.replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The double's state under ``root``, for tests to arrange and inspect."""

    root: Path

    def provide(
        self,
        names: Iterable[str],
        *,
        dirname: str = "/",
        release: str = "6.1.0",
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Make ``names`` findable by ``modprobe -d <dirname>`` on kernel
        ``release``, each ``.ko`` the ELF file of build "v1" (``build_id``),
        or as ``files`` gives it."""
        osrelease = self.root / "proc/sys/kernel/osrelease"
        osrelease.parent.mkdir(parents=True, exist_ok=True)
        osrelease.write_text(release + "\n")
        modules = self.root / dirname.lstrip("/") / "lib/modules" / release
        (modules / "extra").mkdir(parents=True, exist_ok=True)
        names = list(names)
        lines = "".join(f"extra/{name}.ko:\n" for name in names)
        (modules / "modules.dep").write_text(lines)
        for name in names:
            data = (files or {}).get(name, elf_file(build_id(_normalize(name))))
            (modules / "extra" / f"{name}.ko").write_bytes(data)

    def modular(self) -> None:
        """Give the kernel module support: ``/proc/modules`` exists."""
        modules = self.root / "proc/modules"
        modules.parent.mkdir(parents=True, exist_ok=True)
        modules.touch()

    def refuse(self, name: str, answer: str) -> None:
        """An insert of ``name`` fails with the kernel's ``answer``."""
        path = self.root / "refused" / _normalize(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(answer)

    def substitute(self, name: str, build: str) -> None:
        """Once ``name`` is inserted the kernel shows ``build``'s build-id,
        not its file's (another build got there first)."""
        path = self.root / "substituted" / _normalize(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_note(b"GNU\0", NT_GNU_BUILD_ID, build_id(_normalize(name), build), "<"))

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def builtin(self, name: str) -> None:
        """``name`` is built into the kernel: ``/sys/module/<name>`` without ``initstate``."""
        (self.root / "sys/module" / _normalize(name) / "parameters").mkdir(parents=True)

    def configure(self, name: str, text: str) -> None:
        """Write ``<root>/etc/modprobe.d/<name>``."""
        path = self.root / "etc/modprobe.d" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def load(self, name: str, *, refcnt: int = 0, build: str | bytes | None = None) -> None:
        """Mark ``name`` loaded (as if by an earlier pod), not recorded as an
        event; ``build``: the kernel shows that build-id (a ``build_id``
        build name, or a whole note), none if None."""
        module = self.root / "sys/module" / _normalize(name)
        module.mkdir(parents=True, exist_ok=True)
        (module / "initstate").write_text("live\n")
        (module / "refcnt").write_text(f"{refcnt}\n")
        if build is not None:
            note = (
                build
                if isinstance(build, bytes)
                else _note(b"GNU\0", NT_GNU_BUILD_ID, build_id(_normalize(name), build), "<")
            )
            (module / "notes").mkdir(exist_ok=True)
            (module / "notes/.note.gnu.build-id").write_bytes(note)

    def held_build(self, name: str) -> bytes:
        """The build-id note the kernel shows for ``name`` (b"" if none)."""
        path = self.root / "sys/module" / _normalize(name) / "notes/.note.gnu.build-id"
        return path.read_bytes() if path.exists() else b""

    def loaded(self) -> set[str]:
        directory = self.root / "sys/module"
        if not directory.is_dir():
            return set()
        return {p.name for p in directory.iterdir() if (p / "initstate").exists()}

    def events(self) -> list[str]:
        path = self.root / "events"
        return path.read_text().splitlines() if path.exists() else []


def install(bin_dir: Path, root: Path) -> Path:
    """Write ``bin_dir/modprobe`` and ``bin_dir/rmmod``, running this double
    on ``root``; return the first."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("modprobe", "rmmod"):
        script = bin_dir / tool
        command = shlex.join([sys.executable, str(Path(__file__).resolve()), tool, str(root)])
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
    return bin_dir / "modprobe"


class _Failed(Exception):
    """What real modprobe reports and counts in its exit status: kmod says
    ``ERROR`` for what the kernel refused, ``FATAL`` for the rest."""

    def __init__(self, message: str, *, error: bool = False) -> None:
        super().__init__(message)
        self.error = error


class Unsupported(Exception):
    """A setup the double does not model: it stops, the test fails loudly."""


@dataclasses.dataclass
class _Modprobe:
    kernel: Kernel
    dirname: str
    verbose: bool
    quiet: bool
    first_time: bool

    def log(self, message: str, *, error: bool = False) -> None:
        if not self.quiet:
            print(f"modprobe: {'ERROR' if error else 'FATAL'}: {message}", file=sys.stderr)

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

    def _builtin(self, name: str) -> bool:
        module = self.kernel.root / "sys/module" / name
        return module.is_dir() and not (module / "initstate").exists()

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

    def show_depends(self, raw: str, params: Sequence[str]) -> None:
        name = _normalize(raw)
        available = self._available()
        if name not in available:
            raise _Failed(f"Module {raw} not found in directory {self._modules_dir()}")
        probe: list[str] = []
        self._probe_list(name, set(), probe)
        for module in probe:
            args = list(params) if module == name else []
            print(shlex.join(["insmod", str(self._modules_dir() / available[module]), *args]))

    def insert(self, raw: str, params: Sequence[str]) -> None:
        name = _normalize(raw)
        available = self._available()
        if name not in available:
            raise _Failed(f"Module {raw} not found in directory {self._modules_dir()}")
        if self._builtin(name):
            return
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
            path = self._modules_dir() / available[module]
            if self.verbose:
                print(shlex.join(["insmod", str(path), *args]))
            refused = self.kernel.root / "refused" / module
            if refused.exists():
                raise _Failed(f"could not insert '{module}': {refused.read_text()}", error=True)
            substituted = self.kernel.root / "substituted" / module
            note = (substituted if substituted.exists() else path).read_bytes()
            self.kernel.load(module, build=note if substituted.exists() else build_note(note))
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
        for child in sorted(module.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        module.rmdir()
        self._event(f"rmmod {name}")
        self._remove_list(pre)

    def remove(self, raw: str) -> None:
        name = _normalize(raw)
        if name not in self._available():
            raise _Failed(f"Module {raw} not found.")
        self.remove_module(name)


def _called(kernel: Kernel, tool: str, args: Sequence[str]) -> None:
    with (kernel.root / "calls").open("a") as calls:
        calls.write(shlex.join([tool, *args]) + "\n")


def rmmod_main(argv: Sequence[str]) -> int:
    """kmod's ``rmmod NAME...``: ``argv[0]`` is the root."""
    root, *names = argv
    kernel = Kernel(Path(root))
    _called(kernel, "rmmod", names)
    failed = False
    for raw in names:
        name = _normalize(raw)
        module = kernel.root / "sys/module" / name
        if not module.is_dir():
            message = f"Module {name} is not currently loaded"
        elif not (module / "initstate").exists():
            message = f"Module {name} is builtin."
        elif int((module / "refcnt").read_text()) > 0:
            message = f"Module {name} is in use"
        else:
            for child in sorted(module.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() else child.unlink()
            module.rmdir()
            with (kernel.root / "events").open("a") as events:
                events.write(f"rmmod {name}\n")
            continue
        print(f"rmmod: ERROR: {message}", file=sys.stderr)
        failed = True
    return 1 if failed else 0


def main(argv: Sequence[str]) -> int:
    """``argv[0]`` is the root, the rest modprobe's arguments."""
    root, *args = argv
    _called(Kernel(Path(root)), "modprobe", args)
    try:
        options, operands = getopt.gnu_getopt(
            args,
            "varqDd:",
            ["verbose", "all", "remove", "quiet", "dirname=", "first-time", "show-depends"],
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
        if flags & {"-D", "--show-depends"}:
            modprobe.show_depends(operands[0], operands[1:])
        elif flags & {"-a", "--all"}:
            for name in operands:
                modprobe.insert(name, ())
        else:
            modprobe.insert(operands[0], operands[1:])
    except _Failed as err:
        modprobe.log(str(err), error=err.error)
        return 1
    return 0


if __name__ == "__main__":
    tool, *rest = sys.argv[1:]
    sys.exit(rmmod_main(rest) if tool == "rmmod" else main(rest))
