"""``kmm driver`` as the operator's DRA DaemonSet runs it, on an emulated node.

Its settings come from the DaemonSet's environment (no node, driver or path
flags) and a settings file; it serves gRPC health on ``HEALTHCHECK_PORT``
(the DaemonSet's readiness probe passing once the kubelet registered it),
applies a changed file where it can, and refuses a change of
``dra.enabled`` with a Warning Event on its Node while it keeps serving.
"""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import sys
import uuid
from typing import Any

import test_kubelet_emulator as emulating
import test_kubelet_nodes as real

from kmm.api import examples, validation
from kmm.driver import owning
from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubelet import probes
from kmm.operator.dra import builders as dra_builders
from kmm.sandbox import testing


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _no_exec(argv: list[str], timeout: float) -> bool:
    raise AssertionError("no exec probe here")


def _readiness(port: int) -> dict[str, Any]:
    """The operator's DRA DaemonSet's readiness probe, at ``port``."""
    module = validation.parse_module(examples.dra_module())
    container = dra_builders.daemonset(module)["spec"]["template"]["spec"]["containers"][0]
    probe: dict[str, Any] = copy.deepcopy(container["readinessProbe"])
    probe["grpc"]["port"] = port
    return probe


async def test_the_driver_runs_from_the_daemonsets_environment_and_follows_its_settings(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client
) -> None:
    async with emulating.emulated(kmm_api) as (node, running):
        module = f"m{uuid.uuid4().hex[:6]}"
        name = f"{module}.kmm.io"
        real.fake_tree(node.root, module)
        settings = node.directory / "settings.yaml"
        settings.write_text(f"dra:\n  enabled: true\ndeviceClass: {module}\n")
        port = _free_port()
        env = {
            **os.environ,
            "NODE_NAME": node.name,
            "DRIVER_NAME": name,
            "POD_UID": "0000-pod",
            "CDI_ROOT": str(node.cdi_dir),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(node.kubelet_dir / "plugins_registry"),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(node.kubelet_dir / "plugins"),
            "HEALTHCHECK_PORT": str(port),
            "KUBECONFIG": str(sandbox.kubeconfig),
        }
        log = node.directory / "driver.log"
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from kmm.cli import main; main()", "driver",
                f"--module={module}", f"--root={node.root}", f"--config={settings}",
                env=env, stderr=out,
            )  # fmt: skip
        try:

            async def registered() -> bool:
                return running.registry.usable(name)

            async def devices() -> list[str]:
                listing = await kmm_api.request(
                    "GET",
                    resources.RESOURCE_SLICES.path(),
                    query={"fieldSelector": f"spec.nodeName={node.name},spec.driver={name}"},
                )
                return sorted(d["name"] for s in listing["items"] for d in s["spec"]["devices"])

            async def devices_are(expected: list[str]) -> bool:
                return await devices() == expected

            await testing.eventually(registered, "registered with the emulated kubelet")
            assert (node.kubelet_dir / "plugins" / name / "dra.sock").exists()
            await testing.eventually(
                lambda: devices_are([f"{module}0", f"{module}1"]), "both devices published"
            )
            liveness = {"grpc": {"port": port, "service": owning.LIVENESS}}
            assert await probes.check(liveness, {}, _no_exec)
            # The DaemonSet's readiness probe passes: the kubelet registered it.
            assert await probes.check(_readiness(port), {}, _no_exec)

            # Applied where it can be: discovery narrowed, republished.
            settings.write_text(
                f"dra:\n  enabled: true\ndeviceClass: {module}\ndevicePattern: '{module}1'\n"
            )
            await testing.eventually(lambda: devices_are([f"{module}1"]), "one device published")

            # dra.enabled toggled: refused, with an Event on the Node; it keeps serving.
            settings.write_text(f"dra:\n  enabled: false\ndeviceClass: {module}\n")

            async def warned() -> bool:
                listing = await kmm_api.request(
                    "GET",
                    resources.EVENTS.path("default"),
                    query={
                        "fieldSelector": f"involvedObject.name={node.name},reason=RestartRequired"
                    },
                )
                return any("needs a restart" in e["message"] for e in listing["items"])

            await testing.eventually(warned, "the RestartRequired Event on the Node")
            assert process.returncode is None
            assert running.registry.usable(name)
            assert await probes.check(liveness, {}, _no_exec)
            assert await devices() == [f"{module}1"]
        finally:
            if process.returncode is None:
                process.terminate()
            assert await process.wait() == 0, log.read_text()
