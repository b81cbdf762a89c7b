"""Write the pinned wrapper module of one Kubernetes release: kmm sandbox's
``gotools/kubernetes/v<minor>/``.

``k8s.io/kubernetes`` points its staging modules (``k8s.io/api``,
``k8s.io/kubelet``, ...) at ``./staging`` with replace lines, which a module
that requires it cannot use; the wrapper repeats them as the published
``v0.<minor>.<patch>`` versions, requires the commands the sandbox builds
(``tools.go``) and the sandbox's fake CRI runtime (``gotools/fakecri``, by a
replace to its directory), and lets ``go mod tidy`` write ``go.sum``.

``go mod tidy`` checks every line it writes against the Go checksum
database (sum.golang.org, reached through the module proxy's ``/sumdb/``
endpoint when the database itself cannot be dialled: ``GOSUMDB`` stays at its
default, never ``off``); later builds check each download against
``go.sum``. Run it in a build step, never in a test:

    python scripts/kubernetes_wrapper.py v1.37.2

then add the release to ``kmm.sandbox.kubereleases`` (its commit, flags and
feature gates).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GOTOOLS = Path(__file__).resolve().parent.parent / "src" / "kmm" / "sandbox" / "gotools"

TOOLS_GO = """\
//go:build tools

// Package tools pins the Kubernetes {minor} commands kmm sandbox builds: the
// control plane, the kubelet of its kubelet nodes (with the fake container
// runtime of ../../fakecri), the kube-proxy of its container and VM nodes,
// the kubectl of the same release, and the project's DRA test driver that
// kmm kubelet is checked against.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
	// A command too (never compiled here: the tools tag is never set), named
	// so that go mod tidy keeps its requirement.
	_ "kmm.local/sandbox/fakecri"
)
"""


def _go(*args: str, cwd: Path) -> str:
    return subprocess.run(["go", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def main(version: str) -> None:
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", version)
    if match is None:
        raise SystemExit(f"version {version!r}: expected v1.<minor>.<patch>, e.g. v1.37.2")
    minor, patch = match.groups()
    staging_version = f"v0.{minor}.{patch}"
    directory = GOTOOLS / "kubernetes" / f"v1.{minor}"
    directory.mkdir(parents=True, exist_ok=True)
    scratch = directory / "go.mod"
    # Read upstream's go.mod for its staging modules and Go version.
    scratch.write_text(f"module kmm.local/sandbox/kubernetes{minor}\n\ngo 1.25.0\n")
    upstream = Path(
        _go("mod", "download", "-json", f"k8s.io/kubernetes@{version}", cwd=directory)
        .split('"GoMod": "')[1]
        .split('"')[0]
    ).read_text()
    staging = re.findall(r"^\s+(k8s\.io/[\w.-]+) => \./staging/", upstream, re.M)
    go_version = re.search(r"^go (\S+)", upstream, re.M)
    replaces = "\n".join(f"\t{name} => {name} {staging_version}" for name in staging)
    scratch.write_text(
        "// Wrapper module that builds Kubernetes "
        f"{version} for kmm sandbox (scripts/kubernetes_wrapper.py).\n"
        f"module kmm.local/sandbox/kubernetes{minor}\n\n"
        f"go {go_version.group(1) if go_version else '1.25.0'}\n\n"
        f"require k8s.io/kubernetes {version}\n\n"
        "require kmm.local/sandbox/fakecri v0.0.0\n\n"
        f"replace (\n{replaces}\n\tkmm.local/sandbox/fakecri => ../../fakecri\n)\n"
    )
    (directory / "tools.go").write_text(TOOLS_GO.format(minor=f"1.{minor}"))
    _go("mod", "tidy", cwd=directory)
    print(f"wrote {directory}/go.mod and go.sum")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: kubernetes_wrapper.py v1.<minor>.<patch>")
    main(sys.argv[1])
