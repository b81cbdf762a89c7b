"""``kmm preflight`` against a real control plane.

A sandbox of this module's own (its registry on, no container node: nothing
here builds), so the Modules the validations judge are this module's only.
The command runs as users run it, in a process of its own.

- Without an operator, the test writes ``status`` itself through the status
  subresource, as the operator would (a real API, not a mock): the
  command's table and exit codes from those verdicts; the apiserver's
  refusal of a kernel; a validation deleted while waited on; no answer
  within ``--timeout``; ``kubectl kmm preflight`` through the plugin.
- With the operator in process: Modules that need no build (an image the
  registry has, a kernel no mapping matches, an image missing without
  build), ``kmm preflight --wait`` exiting 0 when all pass and 1 otherwise,
  its table naming each failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import helm_support
import ociarchives
import pytest
import test_operator_support as support

from kmm.api import modules, preflight
from kmm.cli import paths, preflighting
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import objects, resources
from kmm.sandbox import cluster, components, pki, testing

KERNEL = "6.12.9-100-amd64"
_VALIDATIONS = preflighting.RESOURCE


@pytest.fixture(scope="module")
def record() -> Iterator[cluster.state.SandboxState]:
    directory = Path(os.path.realpath(tempfile.mkdtemp(prefix="pfc", dir="/tmp")))
    options = cluster.Options(
        directory=directory, cache_dir=paths.cache_dir(), nodes=1, registry=True
    )
    try:
        found = asyncio.run(cluster.up(options))
        # Waits until preflightvalidations are served, too.
        asyncio.run(support.install_manifests(found.kubeconfig))
        yield found
    finally:
        with contextlib.suppress(Exception):
            cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def api(record: cluster.state.SandboxState) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(record.kubeconfig) as found:
        yield found
        # Validations are left in place by the command: not for the next test.
        listing = await found.request("GET", _VALIDATIONS.path())
        for item in listing["items"]:
            with contextlib.suppress(kube_errors.NotFound):
                await found.request("DELETE", _VALIDATIONS.path(name=objects.name(item)))


class Command:
    """One ``kmm preflight`` process; ``name`` is the validation it created."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.name = ""
        self.lines: list[str] = []

    async def created(self) -> str:
        """The name from its first line (``created PreflightValidation NAME``)."""
        assert self.process.stdout is not None
        try:
            line = (await asyncio.wait_for(self.process.stdout.readline(), 120)).decode()
        except TimeoutError:
            await self.kill()
            raise
        self.lines.append(line.rstrip("\n"))
        prefix = "created PreflightValidation "
        if not line.startswith(prefix):
            code, out, err = await self.finished()
            raise AssertionError(f"no validation created: exit {code}", out, err)
        self.name = line[len(prefix) :].strip()
        return self.name

    async def finished(self) -> tuple[int, list[str], str]:
        """Exit code, stdout lines, stderr. The process is killed if it
        outlives this (a failed test leaves no command behind)."""
        try:
            out, err = await asyncio.wait_for(self.process.communicate(), 600)
        finally:
            await self.kill()
        self.lines += out.decode().splitlines()
        return await self.process.wait(), self.lines, err.decode()

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def start(kubeconfig: Path, *args: str, argv0: tuple[str, ...] = ()) -> Command:
    command = argv0 or (sys.executable, "-c", "from kmm.cli import main; main()")
    process = await asyncio.create_subprocess_exec(
        *command,
        "preflight",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "COLUMNS": "250"},
    )
    return Command(process)


def table_rows(lines: list[str]) -> list[list[str]]:
    """The table's rows (header first), one list of cells each."""
    return [
        [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]
        for line in lines
        if "│" in line or "┃" in line
    ]


def entry(namespace: str, name: str, status: str, reason: str, **extra: Any) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "name": name,
        "verificationStatus": status,
        "verificationStage": "Image" if status == "InProgress" else "Done",
        "statusReason": reason,
        "lastTransitionTime": "2026-07-01T12:00:00Z",
        **extra,
    }


async def answer(api: kube_client.Client, name: str, *found: dict[str, Any]) -> None:
    """Write verdicts for the validation's current spec, as the operator does."""
    validation = await api.request("GET", _VALIDATIONS.path(name=name))
    await api.request(
        "PATCH",
        _VALIDATIONS.path(name=name, subresource="status"),
        body={
            "status": {
                "modules": list(found),
                "observedGeneration": validation["metadata"]["generation"],
            }
        },
        content_type=kube_client.MERGE_PATCH,
    )


# -- the command's reading, with verdicts the test writes --------------------------


async def test_a_kernel_admission_refuses_is_named_with_its_field_and_nothing_is_created(
    record: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    command = await start(record.kubeconfig, "--kernel", "6.1", "--wait")
    code, out, err = await command.finished()
    assert code == preflighting.ERROR, (out, err)
    assert "spec.kernelVersion" in err, err
    assert "must split into at least three parts" in err, err
    assert "Traceback" not in err
    assert not out
    assert (await api.request("GET", _VALIDATIONS.path()))["items"] == []


async def test_wait_exits_1_and_names_each_failure(
    record: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    command = await start(
        record.kubeconfig, "--kernel", f"{KERNEL}+", "--push", "--wait", "--timeout", "600"
    )
    name = await command.created()
    assert name.startswith("preflight-")
    created = await api.request("GET", _VALIDATIONS.path(name=name))
    # As typed: the operator trims the "+".
    assert created["spec"] == {"kernelVersion": f"{KERNEL}+", "pushBuiltImage": True}
    image = f"10.253.0.1:5000/a/present:{KERNEL}"
    await answer(
        api,
        name,
        entry("ns-a", "present", "Success", preflight.REASON_IMAGE_EXISTS, image=image),
        entry("ns-b", "building", "InProgress", preflight.REASON_IN_PROGRESS, image=image, pod="p"),
    )
    await answer(
        api,
        name,
        entry("ns-a", "present", "Success", preflight.REASON_IMAGE_EXISTS, image=image),
        entry("ns-a", "unmapped", "Failure", preflight.REASON_MAPPING_NOT_FOUND),
        entry("ns-b", "building", "Failure", f"{preflight.REASON_BUILD_FAILED}: pod ns-b/p failed"),
    )
    code, out, err = await command.finished()
    assert code == preflighting.FAILED, (out, err)
    header, *rows = table_rows(out)
    assert header == list(preflighting.COLUMNS)
    assert rows == [
        ["ns-a", "present", "yes", image, "Success", "verified image exists"],
        ["ns-a", "unmapped", "no", "-", "Failure", "mapping not found"],
        ["ns-b", "building", "-", "-", "Failure", f"{preflight.REASON_BUILD_FAILED}: pod ns-b/p failed"],
    ]  # fmt: skip
    assert "failed: ns-a/unmapped: mapping not found" in out
    assert f"failed: ns-b/building: {preflight.REASON_BUILD_FAILED}: pod ns-b/p failed" in out
    assert out[-1] == (
        f"PreflightValidation {name} is left in place; delete it with: "
        f"kubectl delete preflightvalidation {name}"
    )
    assert await api.request("GET", _VALIDATIONS.path(name=name))


async def test_wait_exits_0_when_every_module_is_success(
    record: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    command = await start(record.kubeconfig, "--kernel", KERNEL, "--wait")
    name = await command.created()
    created = await api.request("GET", _VALIDATIONS.path(name=name))
    assert created["spec"]["pushBuiltImage"] is False
    await answer(
        api,
        name,
        entry("ns-a", "in-tree", "Success", preflight.REASON_NO_IMAGE_NEEDED),
        entry("ns-a", "built", "Success", preflight.REASON_BUILT, image="r/x:1", pod="b"),
    )
    code, out, err = await command.finished()
    assert code == preflighting.PASSED, (out, err)
    assert [row[:5] for row in table_rows(out)[1:]] == [
        ["ns-a", "built", "yes", "r/x:1", "Success"],
        ["ns-a", "in-tree", "-", "-", "Success"],
    ]
    assert f"every Module has its image for kernel {KERNEL}" in out


async def test_wait_exits_2_when_the_operator_does_not_answer_in_time(
    record: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    command = await start(record.kubeconfig, "--kernel", KERNEL, "--wait", "--timeout", "2")
    name = await command.created()
    code, out, err = await command.finished()
    assert code == preflighting.UNFINISHED, (out, err)
    assert "the operator has not answered yet (--timeout: 2 s): is it running?" in out
    assert out[-1].endswith(f"kubectl delete preflightvalidation {name}")


async def test_a_validation_deleted_while_waited_on_ends_the_command(
    record: cluster.state.SandboxState, api: kube_client.Client
) -> None:
    command = await start(record.kubeconfig, "--kernel", KERNEL, "--wait")
    name = await command.created()
    await api.request("DELETE", _VALIDATIONS.path(name=name))
    code, out, err = await command.finished()
    assert code == preflighting.ERROR, (out, err)
    assert f"PreflightValidation {name} was deleted while waiting for it" in err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return helm_support.binary(components.KUBECTL)


async def test_kubectl_kmm_preflight_without_wait_prints_what_it_found(
    record: cluster.state.SandboxState, api: kube_client.Client, kubectl: Path, tmp_path: Path
) -> None:
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        "kmm",
        "preflight",
        "--kernel",
        KERNEL,
        "--timeout",
        "1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=helm_support.environment(
            tmp_path,
            KUBECONFIG=str(record.kubeconfig),
            PATH=f"{kubectl.parent}:{Path(sys.executable).parent}:/usr/bin:/bin",
            COLUMNS="250",
        ),
    )
    command = Command(process)
    name = await command.created()
    code, out, err = await command.finished()
    # No operator: the first look (here 1 s) found no answer, and says so.
    assert code == preflighting.PASSED, (out, err)
    assert "the operator has not answered yet (first look: 1 s): is it running?" in out
    assert table_rows(out) == [list(preflighting.COLUMNS)]
    assert out[-1].endswith(f"kubectl delete preflightvalidation {name}")
    assert await api.request("GET", _VALIDATIONS.path(name=name))


# -- end to end: the operator's verdicts -----------------------------------------------

_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
# No node carries it: the operator makes no loader DaemonSet for these Modules.
_NOWHERE = {"kmm-test/preflight": "nowhere"}


@pytest.fixture(scope="module")
def present(record: cluster.state.SandboxState, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An image for ``KERNEL`` in the sandbox registry: its reference."""
    made = ociarchives.write(
        tmp_path_factory.mktemp("image") / "image.tar", [ociarchives.layer({"kmm_test.ko": b"1"})]
    )
    return containersandbox.push(record.directory, made.path, f"preflight/present:{KERNEL}")


def _module(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": name},
        "spec": {"selector": _NOWHERE, **spec},
    }


def _loader(*mappings: dict[str, Any]) -> dict[str, Any]:
    return {"container": {"modprobe": {"moduleName": "kmm_test"}, "kernelMappings": list(mappings)}}


@contextlib.asynccontextmanager
async def _operator(record: cluster.state.SandboxState) -> AsyncIterator[support.InProcess]:
    """The operator in this process, reaching the registry that references
    name ``10.253.0.1:5000`` at its loopback port, trusting the sandbox CA."""
    assert record.registry is not None
    async with support.operator_in_process(
        record.kubeconfig,
        registry_ca_files=(pki.Pki(record.directory / "pki").ca_cert,),
        registry_endpoints={record.registry.reference_host: record.registry.host},
    ) as running:
        yield running
    # The operator's clients closed their TLS connections; the closing
    # handshakes finish on this loop, which ends with the test.
    await asyncio.sleep(0.2)


async def test_preflight_exits_0_when_every_module_passes_and_1_naming_each_failure(
    record: cluster.state.SandboxState, api: kube_client.Client, present: str
) -> None:
    namespace = "preflight-e2e"
    await api.request("POST", resources.NAMESPACES.path(), body={"metadata": {"name": namespace}})
    absent = present.replace("preflight/present:", "preflight/absent:")
    passing = [
        _module("present", moduleLoader=_loader({"literal": KERNEL, "containerImage": present})),
        _module("in-tree", devicePlugin={"container": {"image": "example.com/plugin:1"}}),
    ]
    failing = [
        _module(
            "unmapped",
            moduleLoader=_loader(
                {"literal": "5.14.0-427.el9.x86_64", "containerImage": "example.com/u:1"}
            ),
        ),
        # No build, no sign: a missing image is a verdict at once.
        _module(
            "absent",
            moduleLoader=_loader({"regexp": r"^6\.12\.", "containerImage": absent}),
        ),
    ]
    try:
        async with _operator(record):
            for body in passing:
                await api.request("POST", _MODULES.path(namespace), body=body)
            # The "+" is trimmed by the operator, as for node kernels.
            command = await start(
                record.kubeconfig, "--kernel", f"{KERNEL}+", "--wait", "--timeout", "300"
            )
            await command.created()
            code, out, err = await command.finished()
            assert code == preflighting.PASSED, (out, err)
            assert table_rows(out)[1:] == [
                [namespace, "in-tree", "-", "-", "Success", preflight.REASON_NO_IMAGE_NEEDED],
                [namespace, "present", "yes", present, "Success", preflight.REASON_IMAGE_EXISTS],
            ]
            assert f"every Module has its image for kernel {KERNEL}+" in out

            for body in failing:
                await api.request("POST", _MODULES.path(namespace), body=body)
            command = await start(
                record.kubeconfig, "--kernel", KERNEL, "--wait", "--timeout", "300"
            )
            name = await command.created()
            code, out, err = await command.finished()
            assert code == preflighting.FAILED, (out, err)
            assert table_rows(out)[1:] == [
                [namespace, "absent", "yes", absent, "Failure", preflight.REASON_IMAGE_MISSING],
                [namespace, "in-tree", "-", "-", "Success", preflight.REASON_NO_IMAGE_NEEDED],
                [namespace, "present", "yes", present, "Success", preflight.REASON_IMAGE_EXISTS],
                [namespace, "unmapped", "no", "-", "Failure", preflight.REASON_MAPPING_NOT_FOUND],
            ]
            assert f"failed: {namespace}/absent: {preflight.REASON_IMAGE_MISSING}" in out
            assert f"failed: {namespace}/unmapped: {preflight.REASON_MAPPING_NOT_FOUND}" in out
            assert out[-1].endswith(f"kubectl delete preflightvalidation {name}")
            # Nothing needed a build: no preflight pod anywhere.
            pods = await api.request("GET", resources.PODS.path(namespace))
            assert pods["items"] == []

            # Deleted while the operator runs, so their finalizers are released.
            for body in passing + failing:
                await api.request("DELETE", _MODULES.path(namespace, objects.name(body)))

            async def gone() -> bool:
                return not (await api.request("GET", _MODULES.path(namespace)))["items"]

            await testing.eventually(gone, "Modules deleted")
    finally:
        await api.request("DELETE", resources.NAMESPACES.path(name=namespace))
