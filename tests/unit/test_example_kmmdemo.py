"""The example of examples/kmmdemo: its Modules pass kmm's admission, and
every name they use is the one its other files use.

A Module, its Dockerfile, its C sources, the README's commands and the
sandbox agree only by name (a ConfigMap key, a secret's path in a RUN, the
modules Kbuild makes, the firmware file a module requests, the device class
it makes, the sandbox's key files): each name is read from both sides here,
so renaming one side alone fails. That the sources compile for both kernel
lines is ``make vm-test-modules``'s (scripts/build_vm_test_modules.py); that
they load is the VM node tests'.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import crdpruning
import pytest
import yaml

from kmm.api import crd, installation, kernels, labels, validation
from kmm.operator.build import podparts
from kmm.sandbox.vmnodes import kernels as vm_kernels
from kmm.sandbox.vmnodes import kind as vm_kind
from kmm.sandbox.vmnodes import planning as vm_planning

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kmmdemo"
SOURCES = EXAMPLE / "src"

Obj = dict[str, Any]


def _documents(name: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all((EXAMPLE / name).read_text()) if doc]


def _module(name: str) -> Obj:
    (module,) = (doc for doc in _documents(name) if doc["kind"] == "Module")
    return module


def _container(module: Obj) -> Obj:
    container: Obj = module["spec"]["moduleLoader"]["container"]
    return container


def _mapping(module: Obj) -> Obj:
    (mapping,) = _container(module)["kernelMappings"]
    return mapping


def _dockerfile() -> str:
    return (EXAMPLE / "Dockerfile").read_text()


def _commands() -> list[list[str]]:
    """The README's shell commands, one argv per (joined) line."""
    text = (EXAMPLE / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def _created(kind: str, name: str) -> list[str]:
    """The argv of the README's ``kubectl create configmap NAME ...`` or
    ``kubectl create secret generic NAME ...``."""
    words = ["kubectl", "create", *(["secret", "generic"] if kind == "secret" else [kind]), name]
    found = [c for c in _commands() if c[: len(words)] == words]
    assert len(found) == 1, f"README.md makes {kind} {name} {len(found)} times"
    return found[0]


def _kbuild_modules() -> set[str]:
    (line,) = re.findall(r"^obj-m := (.*)$", (SOURCES / "Kbuild").read_text(), re.M)
    return {word.removesuffix(".o") for word in line.split()}


def _define(source: str, name: str) -> str:
    (value,) = re.findall(rf'^#define {name} "([^"]*)"$', (SOURCES / source).read_text(), re.M)
    return value


def _parameters(source: str) -> set[str]:
    return set(re.findall(r"^module_param\((\w+),", (SOURCES / source).read_text(), re.M))


def _sample_kernels() -> list[str]:
    """One made-up version of each of Debian's kernel lines, built from the
    line's own pattern (a real one moves with the archive): 6.12's has the
    ``+`` an image tag may not hold."""
    return [
        re.sub(r"\\(.)", r"\1", line.version.pattern.replace(r"(\d+)", "7"))
        for line in vm_kernels.LINES
    ]


# -- the Dockerfile ----------------------------------------------------------


def test_the_dockerfile_carries_the_sources(tmp_path: Path) -> None:
    out = tmp_path / "Dockerfile"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_examples.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_text() == _dockerfile(), (
        "examples/kmmdemo/Dockerfile's heredocs differ from examples/kmmdemo/src/: "
        "run python scripts/render_examples.py"
    )


def test_the_dockerfile_builds_from_the_toolkit_kmm_passes() -> None:
    text = _dockerfile()
    assert re.search(r"^ARG DTK_AUTO$", text, re.M)
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == ["${DTK_AUTO}", "${DTK_AUTO}"]
    assert "/usr/src/linux-headers-${KERNEL_FULL_VERSION}" in text
    # Every build argument a Module passes is one the Dockerfile declares.
    declared = set(re.findall(r"^ARG (\w+)", text, re.M))
    for name in ("module.yaml", "module-v2.yaml"):
        passed = {arg["name"] for arg in _mapping(_module(name))["build"]["buildArgs"]}
        assert passed <= declared, passed - declared


# -- admission ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["module.yaml", "module-v2.yaml"])
def test_the_modules_pass_admission(name: str) -> None:
    raw = _module(name)
    module = validation.parse_module(copy.deepcopy(raw))
    (version,) = crd.render()["spec"]["versions"]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert crdpruning.pruned(spec_schema, raw["spec"]) == []
    metadata = raw["metadata"]
    assert len(metadata["name"]) + len(metadata["namespace"]) <= labels.MAX_NAME_AND_NAMESPACE
    # Nothing the warnings policy names (kmm.api.admission.warnings).
    text = yaml.safe_dump(raw)
    for no_effect in ("kanikoParams", "unsignedImage", "rawArgs"):
        assert no_effect not in text
    # Each kernel line gets its image and the files to sign, at the path the
    # Dockerfile puts the modules (the kernel as KMM passes it, '+' kept).
    for kernel in _sample_kernels():
        target = kernels.target(module, kernel)
        assert target is not None
        assert target.image.endswith(f":{kernels.tag_safe(kernel)}-v{_container(raw)['version']}")
        assert target.in_tree_modules_to_remove == ("dummy",)
        assert target.sign is not None
        directory = f"/opt/lib/modules/{kernel}"
        assert set(target.sign.files_to_sign) == {f"{directory}/{m}.ko" for m in _kbuild_modules()}


def test_version_2_is_version_1_with_another_version() -> None:
    first, second = _module("module.yaml"), _module("module-v2.yaml")
    for module, version in ((first, "1"), (second, "2")):
        container = _container(module)
        assert container.pop("version") == version
        mapping = _mapping(module)
        image = mapping.pop("containerImage")
        assert image.endswith(f"-v{version}")
        mapping["containerImage"] = image.removesuffix(f"-v{version}")
        args = {arg["name"]: arg["value"] for arg in mapping["build"].pop("buildArgs")}
        assert args.pop("KMMDEMO_VERSION") == version
        mapping["build"]["buildArgs"] = args
    assert first == second


# -- names shared with the other files ----------------------------------------


def test_the_build_reads_what_the_readme_makes() -> None:
    build = _mapping(_module("module.yaml"))["build"]
    config_map = build["dockerfileConfigMap"]["name"]
    command = _created("configmap", config_map)
    assert f"--from-file={podparts.DOCKERFILE_KEY}=examples/kmmdemo/Dockerfile" in command
    assert (ROOT / "examples/kmmdemo/Dockerfile").is_file()
    (secret,) = (s["name"] for s in build["secrets"])
    (literal,) = (a for a in _created("secret", secret) if a.startswith("--from-literal="))
    key = literal.removeprefix("--from-literal=").split("=", 1)[0]
    assert f"{podparts.secret_path(secret)}/{key}" in _dockerfile()


def test_the_sign_uses_the_sandboxs_key() -> None:
    sign = _mapping(_module("module.yaml"))["sign"]
    files = vm_planning.signing_key_path(Path("$D"))
    for secret, key, path in (
        (sign["keySecret"]["name"], "key", files.key),
        (sign["certSecret"]["name"], "cert", files.certificate),
    ):
        assert f"--from-file={key}={path}" in _created("secret", secret)


def test_the_loader_loads_what_the_sources_make() -> None:
    modprobe = _container(_module("module.yaml"))["modprobe"]
    made = _kbuild_modules()
    assert set(modprobe["modulesLoadingOrder"]) == made
    assert modprobe["moduleName"] == "kmmdemo_peer"
    # Parameters go to moduleName (as in KMM), kmmdemo's own through modprobe.d.
    for parameter in modprobe["parameters"]:
        assert parameter.split("=", 1)[0] in _parameters("kmmdemo_peer.c")
    options = re.findall(r"options kmmdemo (\w+)=", _dockerfile())
    assert options
    assert set(options) <= _parameters("kmmdemo.c")
    # The modules land where the loader's modprobe -d looks.
    copied = re.findall(r"^COPY --from=builder (.*) (\S+)$", _dockerfile(), re.M)
    sources = " ".join(f"/build/{m}.ko" for m in sorted(made))
    assert copied == [(sources, "/opt/lib/modules/${KERNEL_FULL_VERSION}/")]
    assert modprobe.get("dirName", "/opt") == "/opt"
    # The firmware kmmdemo requests is under firmwarePath in the image.
    firmware = _define("kmmdemo.c", "KMMDEMO_FIRMWARE")
    assert f">{modprobe['firmwarePath']}/{firmware}" in _dockerfile()


def test_the_dra_driver_finds_the_devices_kmmdemo_makes() -> None:
    documents = _documents("module.yaml")
    module = _module("module.yaml")
    dra = module["spec"]["dra"]
    device_class = _define("kmmdemo.c", "KMMDEMO_NAME")
    assert f"--module={device_class}" in dra["container"]["args"]
    assert f"--device-class={device_class}" in dra["container"]["args"]
    # Its account and RBAC, as kmm renders them.
    rbac = [doc for doc in documents if doc["kind"] != "Module"]
    assert rbac == installation.dra_driver_rbac(module["metadata"]["namespace"])
    assert dra["serviceAccountName"] == rbac[0]["metadata"]["name"]
    # The workload claims from the Module's class, with the image pushed for the driver.
    (template,) = (d for d in _documents("workload.yaml") if d["kind"] == "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == dra["deviceClasses"][0]["name"]
    (pod,) = (d for d in _documents("workload.yaml") if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["image"] == dra["container"]["image"]
    pushed = {f"10.253.0.1:5000/{c[-1]}" for c in _commands() if c[1:3] == ["sandbox", "push"]}
    assert dra["container"]["image"] in pushed


def test_the_readme_runs_on_the_sandboxs_vm_nodes() -> None:
    module = _module("module.yaml")
    assert module["spec"]["selector"] == {vm_kind.LABEL: "true"}
    commands = _commands()
    (up,) = (c for c in commands if c[1:3] == ["sandbox", "up"])
    assert "--vm-nodes" in up
    (operator,) = (c for c in commands if c[1:2] == ["operator"])
    builder = operator[operator.index("--builder-image") + 1]
    assert builder in {
        f"10.253.0.1:5000/{c[-1]}" for c in commands if c[1:3] == ["sandbox", "push"]
    }
    node = f"{vm_kind.NODE_PREFIX}0"
    name = f"{module['metadata']['namespace']}/{module['metadata']['name']}"
    assert [c for c in commands if c[1:2] == ["upgrade"]] == [
        [".venv/bin/kmm", "upgrade", name, "--to", "1", node],
        [".venv/bin/kmm", "upgrade", name, "--to", "2", node],
        [".venv/bin/kmm", "upgrade", name, "--to", "1", node],  # opted in to eviction
    ]
