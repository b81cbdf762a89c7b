"""Which Debian kernels VM nodes boot: chosen once, recorded in one list.

Debian bookworm serves two kernel lines with headers: 6.1
(``linux-image-6.1.0-NN-amd64``) and 6.12
(``linux-image-6.12.NNN+deb12-amd64``), both signed for Secure Boot. Their
versions move with security updates and old ones leave the archive, so no
version is written in the source or a test: ``choose`` takes, per line, the
newest version whose image and headers packages are both in the archive's
package list, and ``ensure`` records the choice as ``<cache>/vm/kernels.json``
the first time (asking the archive through apt, with a private state
directory: the host's apt configuration is neither read nor changed). That
list keys every cache built from it (the node image, the toolkits): they are
built again together when it changes. Delete the file (or ``ensure(...,
refresh=True)``) to choose anew.

The list's first kernel is the one nodes boot unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from kmm.api import kernels as api_kernels
from kmm.sandbox import errors

__all__ = [
    "LINES",
    "SUITE",
    "KernelList",
    "Line",
    "choose",
    "ensure",
    "list_path",
    "load",
    "sources",
]

SUITE: Final = "bookworm"
_MIRROR: Final = "http://deb.debian.org/debian"
_KEYRING: Final = "/usr/share/keyrings/debian-archive-keyring.gpg"
_FORMAT: Final = 1


@dataclasses.dataclass(frozen=True)
class Line:
    """One kernel line: its name and the pattern of its version in a
    ``linux-image-<version>`` package name (group 1: the number that orders
    the line's versions)."""

    name: str
    version: re.Pattern[str]


LINES: Final = (
    Line("6.1", re.compile(r"6\.1\.0-(\d+)-amd64")),
    Line("6.12", re.compile(r"6\.12\.(\d+)\+deb12-amd64")),
)


def sources(suite: str = SUITE) -> tuple[str, ...]:
    """The archive's one-line sources: the suite, its updates and security."""
    return (
        f"deb {_MIRROR} {suite} main",
        f"deb {_MIRROR} {suite}-updates main",
        f"deb {_MIRROR}-security {suite}-security main",
    )


@dataclasses.dataclass(frozen=True)
class KernelList:
    """The kernels chosen for VM nodes, one per line, in ``LINES`` order."""

    versions: tuple[str, ...]
    suite: str = SUITE

    @property
    def default(self) -> str:
        """What nodes boot unless told otherwise: the first line's."""
        return self.versions[0]

    @property
    def key(self) -> str:
        """What keys every cache built from this list (12 hex digits)."""
        text = "\n".join((self.suite, *self.versions))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def other(self, kernel: str) -> str:
        """A kernel of the list that is not ``kernel`` (for a reboot onto
        another line)."""
        self.require(kernel)
        return next(version for version in self.versions if version != kernel)

    def require(self, kernel: str) -> None:
        """SandboxError unless ``kernel`` is on the list."""
        if kernel not in self.versions:
            raise errors.SandboxError(
                f"kernel {kernel!r} is not one the VM node image holds ({', '.join(self.versions)})"
            )

    def tag(self, kernel: str) -> str:
        """``kernel`` in the tag-safe form an image reference needs."""
        self.require(kernel)
        return api_kernels.tag_safe(kernel)


def choose(package_names: Iterable[str], lines: Iterable[Line] = LINES) -> KernelList:
    """Per line, the newest version with both ``linux-image-<v>`` and
    ``linux-headers-<v>`` among ``package_names``. SandboxError naming a
    line the list has no such version of."""
    names = set(package_names)
    chosen = []
    for line in lines:
        pattern = re.compile(rf"linux-image-({line.version.pattern})")
        candidates = []
        for name in names:
            match = pattern.fullmatch(name)
            if match and f"linux-headers-{match.group(1)}" in names:
                candidates.append((int(match.group(2)), match.group(1)))
        if not candidates:
            raise errors.SandboxError(
                f"the archive serves no {line.name} kernel with both its image and its "
                f"headers (linux-image-{line.version.pattern})"
            )
        chosen.append(max(candidates)[1])
    return KernelList(versions=tuple(chosen))


def list_path(cache_dir: Path) -> Path:
    return cache_dir / "vm" / "kernels.json"


def load(cache_dir: Path) -> KernelList | None:
    """The recorded list, or None when none was chosen yet."""
    path = list_path(cache_dir)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise errors.SandboxError(f"{path} is not a readable kernel list: {err}") from err
    if document.get("format") != _FORMAT:
        raise errors.SandboxError(f"{path} has format {document.get('format')!r}; delete it")
    return KernelList(versions=tuple(document["versions"]), suite=str(document["suite"]))


def _save(cache_dir: Path, chosen: KernelList) -> None:
    path = list_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"format": _FORMAT, "suite": chosen.suite, "versions": list(chosen.versions)}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    temporary.replace(path)


def _archive_names(suite: str) -> list[str]:
    """Every package name the archive's ``suite`` lists, through apt with a
    state directory of its own (downloads the package lists: a build step's
    work, never a test's)."""
    with tempfile.TemporaryDirectory(prefix="kmm-apt-") as work:
        root = Path(work)
        for directory in ("lists/partial", "cache/archives/partial"):
            (root / directory).mkdir(parents=True)
        (root / "status").touch()
        keyring = f"[signed-by={_KEYRING}] " if os.path.exists(_KEYRING) else ""
        (root / "sources.list").write_text(
            "".join(line.replace("deb ", f"deb {keyring}", 1) + "\n" for line in sources(suite))
        )
        options = [
            f"-oDir::Etc::SourceList={root / 'sources.list'}",
            f"-oDir::Etc::SourceParts={root / 'nothing'}",
            f"-oDir::State::Lists={root / 'lists'}",
            f"-oDir::State::Status={root / 'status'}",
            f"-oDir::Cache={root / 'cache'}",
            "-oAPT::Architecture=amd64",
            "-oAcquire::Languages=none",
        ]
        for argv in (["apt-get", *options, "update"], ["apt-cache", *options, "pkgnames"]):
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise errors.SandboxError(
                    f"`{argv[0]} {argv[-1]}` for the {suite} archive failed: "
                    f"{result.stderr.strip()[-2000:]}"
                )
        return result.stdout.split()


def ensure(cache_dir: Path, *, refresh: bool = False) -> KernelList:
    """The recorded list; chosen from the archive and recorded when there is
    none yet (or ``refresh``)."""
    recorded = None if refresh else load(cache_dir)
    if recorded is not None:
        return recorded
    chosen = choose(_archive_names(SUITE))
    _save(cache_dir, chosen)
    return chosen
