"""``kubectl kmm``: the sandbox's kubectl finds the installed ``kubectl-kmm``
on PATH and runs it against the cluster of its $KUBECONFIG."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import helm_support
import pytest
import test_operator_support as support
from kubernetes_asyncio import client

from kmm.api import labels, modules
from kmm.sandbox import components, testing

manifests = support.manifests


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return helm_support.binary(components.KUBECTL)


async def _kubectl(kubectl: Path, home: Path, kubeconfig: Path, *args: str) -> tuple[int, str]:
    # The venv's bin holds kubectl-kmm; nothing else of this machine's PATH,
    # so an older kubectl or plugin elsewhere cannot answer instead.
    env = helm_support.environment(
        home,
        KUBECONFIG=str(kubeconfig),
        PATH=f"{kubectl.parent}:{Path(sys.executable).parent}:/usr/bin:/bin",
        COLUMNS="200",  # one table row a line
    )
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    return await process.wait(), output.decode()


async def test_kubectl_kmm_modules_shows_a_converged_module(
    sandbox: testing.RunningSandbox,
    manifests: None,
    api_client: client.ApiClient,
    kubectl: Path,
    namespace: str,
    tmp_path: Path,
) -> None:
    code, version = await _kubectl(
        kubectl, tmp_path, sandbox.kubeconfig, "version", "--output", "json"
    )
    assert code == 0, version
    reported = json.loads(version)
    # The pinned release on both sides: inside kubectl's version skew.
    assert reported["clientVersion"]["gitVersion"] == components.KUBECTL.version
    assert reported["serverVersion"]["gitVersion"] == components.KUBECTL.version

    code, plugins = await _kubectl(kubectl, tmp_path, sandbox.kubeconfig, "plugin", "list")
    assert code == 0, plugins
    assert str(Path(sys.executable).parent / "kubectl-kmm") in plugins

    name = "plugin"
    select = f"kmm-test/{namespace}"
    chosen = sandbox.node_names[:2]
    body = support.module_body(name, {select: "yes"})
    ready_key = labels.ready(namespace, name)

    async def loaded() -> bool:
        nodes = await support.node_labels(api_client)
        return {n for n, lbl in nodes.items() if ready_key in lbl} == set(chosen)

    async with (
        support.selecting(api_client, chosen, select),
        support.operator_in_process(sandbox.kubeconfig),
    ):
        await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, body
        )
        await testing.eventually(loaded, "module loaded on 2 nodes")
        code, table = await _kubectl(
            kubectl, tmp_path, sandbox.kubeconfig, "kmm", "modules", "-n", namespace, "--wait", "60"
        )
        assert code == 0, table
        cells = [
            [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]
            for line in table.splitlines()
            if "│" in line or "┃" in line
        ]
        header, *rows = cells
        assert header[:5] == ["NAMESPACE", "NAME", "READY", "AVAILABLE/DESIRED", "LOADED ON"]
        (row,) = rows
        assert row[:2] == [namespace, name]
        assert row[2].startswith("True")
        assert row[4] == ", ".join(sorted(chosen))

        # A refusal reaches the user as kubectl's own command would show it:
        # the plugin's exit status and its message naming it as typed.
        code, usage = await _kubectl(kubectl, tmp_path, sandbox.kubeconfig, "kmm", "no-such")
        assert code == 2, usage
        assert "Usage: kubectl kmm" in usage

        # Deleted while the operator runs, so its finalizer is released: the
        # operator watches every namespace, and later tests count Modules.
        await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
        )

        async def gone() -> bool:
            return await support.get_module(api_client, namespace, name) is None

        await testing.eventually(gone, "Module deleted")
