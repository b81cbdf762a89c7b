"""The build and sign scripts' push-or-keep logic, run by dash against a stub buildah.

The scripts' fixed paths (/run/kmm, /tmp, /dev/termination-log) are moved
under a temporary directory; ``buildah`` and ``sign-file`` are stubs that
log their arguments; openssl is the host's. What buildah really does is
the integration tests' (test_build_pods_in_containers,
test_preflight_pods_in_containers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_build_pods

from kmm.api import labels
from kmm.operator.build import inputs, scripts

_BUILDAH = r"""#!/bin/sh
echo "buildah $*" >>"$STUB_LOG"
verb=$1
all="$*"
while [ "$#" -gt 0 ]; do
    case $1 in
    --iidfile) printf 'sha256:%s' "$verb-id" >"$2" ;;
    --digestfile) printf 'sha256:pushed' >"$2" ;;
    esac
    shift
done
case $verb in
from) echo ctr ;;
mount) echo "$STUB_ROOT" ;;
inspect)
    case $all in
    *FromImageDigest*) echo "sha256:unsigned" ;;
    *build-hash*) echo "${STUB_BUILD_HASH:-}" ;;
    *rebuild-trigger*) echo "${STUB_TRIGGER:-}" ;;
    esac
    ;;
esac
"""

_SIGN_FILE = r"""#!/bin/sh
echo "sign-file $*" >>"$STUB_LOG"
printf '~signed~' >>"$4"
"""


@dataclasses.dataclass
class _Ran:
    returncode: int
    stderr: str
    calls: list[str]
    summary: dict[str, Any] | None


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """(key, certificate) in PEM, made once."""
    directory = tmp_path_factory.mktemp("signing")
    subprocess.run(
        [
            "openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=t", "-keyout", "key", "-out", "cert",
        ],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    return (directory / "key").read_bytes(), (directory / "cert").read_bytes()


@pytest.fixture
def sandbox(tmp_path: Path, signing: tuple[bytes, bytes]) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("buildah", _BUILDAH), ("sign-file", _SIGN_FILE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "tmp").mkdir()
    dockerfile = tmp_path / "run/kmm/dockerfile/Dockerfile"
    dockerfile.parent.mkdir(parents=True)
    dockerfile.write_text("FROM scratch\n")
    for kind, pem in zip(("key", "cert"), signing, strict=True):
        (tmp_path / f"run/kmm/signing/{kind}").mkdir(parents=True)
        (tmp_path / f"run/kmm/signing/{kind}/{kind}").write_bytes(pem)
    module = tmp_path / "root/opt/lib/modules/k/a.ko"
    module.parent.mkdir(parents=True)
    module.write_bytes(b"module")
    return tmp_path


def _run(sandbox: Path, script: str, role: str, args: list[str], **env: str) -> _Ran:
    # /tmp/ first: the sandbox itself may lie under /tmp.
    moved = (
        script.replace("/tmp/", f"{sandbox}/tmp/")
        .replace("/dev/termination-log", f"{sandbox}/termination-log")
        .replace("/run/kmm/", f"{sandbox}/run/kmm/")
        .replace("/etc/ssl/certs/", f"{sandbox}/etc/ssl/certs/")
    )
    log = sandbox / "calls.log"
    log.write_text("")
    termination = sandbox / "termination-log"
    termination.unlink(missing_ok=True)
    done = subprocess.run(
        ["dash", "-c", moved, f"kmm-{role}", *args],
        env={
            "PATH": f"{sandbox}/bin:{os.environ['PATH']}",
            "STUB_LOG": str(log),
            "STUB_ROOT": str(sandbox / "root"),
            "KMM_IMAGE": "reg.io/m:k",
            "KMM_PUSH_TLS_VERIFY": "true",
            "KMM_PULL_TLS_VERIFY": "false",
            "KMM_UNSIGNED_IMAGE": "reg.io/m:unsigned",
            "KMM_DIR_NAME": "/opt",
            "KMM_KEY_SECRET": "k",
            "KMM_CERT_SECRET": "c",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    summary = json.loads(termination.read_text()) if termination.exists() else None
    return _Ran(done.returncode, done.stderr, log.read_text().splitlines(), summary)


def _verbs(ran: _Ran) -> list[str]:
    return [call.split()[1] for call in ran.calls if call.startswith("buildah ")]


def test_a_build_pushes_and_says_the_registrys_digest(sandbox: Path) -> None:
    ran = _run(sandbox, scripts.BUILD, "build", ["--build-arg=A=1"])
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == ["build", "push"]
    assert "buildah push --tls-verify=true" in ran.calls[1]
    assert ran.summary == {"image": "reg.io/m:k", "digest": "sha256:pushed", "pushed": True}


def test_a_build_told_not_to_push_keeps_the_image_and_says_its_id(sandbox: Path) -> None:
    ran = _run(sandbox, scripts.BUILD, "build", ["--build-arg=A=1"], KMM_PUSH="false")
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == ["build"]
    assert "--tag reg.io/m:k --build-arg=A=1" in ran.calls[0]
    assert ran.summary == {"image": "reg.io/m:k", "pushed": False, "imageId": "sha256:build-id"}
    assert "not pushed (KMM_PUSH=false)" in ran.stderr


def test_a_sign_pulls_signs_and_pushes(sandbox: Path) -> None:
    ran = _run(sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko", "/opt/none-*.ko"])
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == ["from", "inspect", "mount", "umount", "commit", "push"]
    assert "buildah from --quiet --pull=always --tls-verify=false reg.io/m:unsigned" in ran.calls
    assert (sandbox / "root/opt/lib/modules/k/a.ko").read_bytes() == b"module~signed~"
    assert ran.summary == {
        "image": "reg.io/m:k",
        "digest": "sha256:pushed",
        "pushed": True,
        "signed": ["/opt/lib/modules/k/a.ko"],
        "unmatched": ["/opt/none-*.ko"],
        "unsignedDigest": "sha256:unsigned",  # what the operator deletes once signed
    }


def test_a_build_labels_what_made_the_image_and_clears_the_signs_labels(sandbox: Path) -> None:
    ran = _run(sandbox, scripts.BUILD, "build", [], KMM_BUILD_HASH="b1", KMM_REBUILD_TRIGGER="4")
    assert ran.returncode == 0, ran.stderr
    build = ran.calls[0]
    for label in (
        f"--label {labels.IMAGE_BUILD_HASH}=b1",
        f"--label {labels.IMAGE_REBUILD_TRIGGER}=4",
        f"--label {labels.IMAGE_SIGNED}= ",
        f"--label {labels.IMAGE_SIGNING_CERT}= ",
        f"--label {labels.IMAGE_SIGN_HASH}= ",
    ):
        assert label in build, build
    plain = _run(sandbox, scripts.BUILD, "build", [])  # preflight pods: no labels
    assert "--label" not in plain.calls[0]


def test_a_sign_labels_its_certificate_as_the_operator_computes_it(
    sandbox: Path, signing: tuple[bytes, bytes]
) -> None:
    ran = _run(
        sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"],
        KMM_SIGN_HASH="s1", KMM_EXPECT_BUILD_HASH="b1", STUB_BUILD_HASH="b1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == [
        "from", "inspect", "inspect", "inspect", "mount", "umount", "config", "commit", "push",
    ]  # fmt: skip
    (config,) = [c for c in ran.calls if c.startswith("buildah config")]
    fingerprint = inputs.fingerprint(signing[1])
    assert fingerprint is not None
    assert config == (
        f"buildah config --label {labels.IMAGE_SIGNED}=true "
        f"--label {labels.IMAGE_SIGNING_CERT}={fingerprint} "
        f"--label {labels.IMAGE_SIGN_HASH}=s1 ctr"
    )


@pytest.mark.parametrize(
    ("found", "trigger"), [("b0", ""), ("", ""), ("b1", "2")], ids=["other", "none", "pass"]
)
def test_a_sign_refuses_an_unsigned_image_of_other_inputs(
    sandbox: Path, found: str, trigger: str
) -> None:
    ran = _run(
        sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"],
        KMM_SIGN_HASH="s1", KMM_EXPECT_BUILD_HASH="b1", KMM_REBUILD_TRIGGER="3",
        STUB_BUILD_HASH=found, STUB_TRIGGER=trigger,
    )  # fmt: skip
    assert ran.returncode == scripts.STALE_EXIT
    assert "is not the build of the Module's current inputs" in ran.stderr
    assert _verbs(ran) == ["from", "inspect", "inspect"]  # nothing signed, nothing pushed
    assert (sandbox / "root/opt/lib/modules/k/a.ko").read_bytes() == b"module"


def test_a_sign_of_a_local_image_told_not_to_push_neither_pulls_nor_pushes(
    sandbox: Path,
) -> None:
    ran = _run(
        sandbox,
        scripts.SIGN,
        "sign",
        ["/opt/lib/modules/k/*.ko"],
        KMM_PUSH="false",
        KMM_UNSIGNED_LOCAL="true",
        KMM_UNSIGNED_IMAGE="localhost/u:latest",
    )
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == ["from", "mount", "umount", "commit"]
    assert "buildah from --quiet --pull=never localhost/u:latest" in ran.calls
    assert ran.summary == {
        "image": "reg.io/m:k",
        "pushed": False,
        "imageId": "sha256:commit-id",
        "signed": ["/opt/lib/modules/k/a.ko"],
        "unmatched": [],
    }


def test_a_sign_of_a_local_image_may_push_the_result(sandbox: Path) -> None:
    ran = _run(
        sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"], KMM_UNSIGNED_LOCAL="true"
    )
    assert ran.returncode == 0, ran.stderr
    assert _verbs(ran) == ["from", "mount", "umount", "commit", "push"]
    assert "--pull=never" in ran.calls[0]
    assert ran.summary is not None
    assert ran.summary["pushed"] is True


@pytest.mark.parametrize(("script", "role"), [(scripts.BUILD, "build"), (scripts.SIGN, "sign")])
def test_an_unknown_push_setting_is_refused_before_any_work(
    sandbox: Path, script: str, role: str
) -> None:
    ran = _run(sandbox, script, role, ["/opt/lib/modules/k/*.ko"], KMM_PUSH="no")
    assert ran.returncode == 1
    assert f"kmm-{role}: error: KMM_PUSH must be true or false, not no" in ran.stderr
    assert ran.calls == []
    assert ran.summary is None


def _der(sandbox: Path, kind: str) -> None:
    """Rewrite the sandbox's key or certificate in DER."""
    path = sandbox / f"run/kmm/signing/{kind}/{kind}"
    command = ["openssl", "pkey"] if kind == "key" else ["openssl", "x509"]
    der = subprocess.run(
        [*command, "-in", str(path), "-outform", "DER"], check=True, capture_output=True
    ).stdout
    path.write_bytes(der)


def test_a_der_key_is_converted_and_a_der_certificate_taken(sandbox: Path) -> None:
    _der(sandbox, "key")
    _der(sandbox, "cert")
    ran = _run(sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"])
    assert ran.returncode == 0, ran.stderr
    [call] = [c for c in ran.calls if c.startswith("sign-file ")]
    # sign-file gets the PEM conversion, the certificate as given.
    assert call.split()[2:4] == [f"{sandbox}/tmp/key.pem", f"{sandbox}/run/kmm/signing/cert/cert"]
    assert (sandbox / "tmp/key.pem").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("key", "key 'key' of Secret k is not a PEM or DER private key"),
        ("cert", "key 'cert' of Secret c is not a PEM or DER certificate"),
    ],
)
def test_a_key_or_certificate_that_is_neither_pem_nor_der_is_refused_naming_its_secret(
    sandbox: Path, kind: str, message: str
) -> None:
    (sandbox / f"run/kmm/signing/{kind}/{kind}").write_bytes(b"not a key\n")
    ran = _run(sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"])
    assert ran.returncode == 1
    assert f"kmm-sign: error: {message}" in ran.stderr
    assert not any(c.startswith("sign-file ") for c in ran.calls)
    assert ran.summary is None


def test_a_key_that_is_not_the_certificates_is_refused_naming_both_secrets(
    sandbox: Path,
) -> None:
    other = subprocess.run(
        ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        check=True,
        capture_output=True,
    ).stdout
    (sandbox / "run/kmm/signing/key/key").write_bytes(other)
    ran = _run(sandbox, scripts.SIGN, "sign", ["/opt/lib/modules/k/*.ko"])
    assert ran.returncode == 1
    assert (
        "kmm-sign: error: the key of Secret k does not match the certificate of Secret c"
        in ran.stderr
    )
    assert not any(c.startswith("sign-file ") for c in ran.calls)


def test_the_registry_ca_file_joins_the_system_bundle_before_any_pull(sandbox: Path) -> None:
    system = sandbox / "etc/ssl/certs/ca-certificates.crt"
    system.parent.mkdir(parents=True)
    system.write_text("-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n")
    ca = sandbox / "registry-ca.crt"
    ca.write_text(test_build_pods.bundle(200 * 1024))
    for script, role in ((scripts.BUILD, "build"), (scripts.SIGN, "sign")):
        before = system.read_text()
        ran = _run(sandbox, script, role, ["/opt/lib/modules/k/*.ko"], KMM_REGISTRY_CA_FILE=str(ca))
        assert ran.returncode == 0, ran.stderr
        after = system.read_text()
        assert after.startswith(before)
        assert ca.read_text() in after[len(before) :]
    ca.write_text("")
    ran = _run(sandbox, scripts.BUILD, "build", [], KMM_REGISTRY_CA_FILE=str(ca))
    assert ran.returncode == 1
    assert f"the registry CA file {ca} is missing or empty" in ran.stderr
    assert ran.calls == []  # nothing pulled without it
