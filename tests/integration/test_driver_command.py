"""``kmm driver`` as a process against the sandbox, on a fake host tree.

It publishes the fake module's devices as a ResourceSlice for the node,
serves the kubelet on its sockets under ``--root``, and on SIGTERM removes
its sockets and exits 0.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from kmm.kube import client as kube_client
from kmm.kube import resources
from kmm.kubeletplugin import plugins
from kmm.sandbox import testing

pytestmark = pytest.mark.integration


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="kc", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fake_tree(root: pathlib.Path) -> None:
    (root / "dev").mkdir()
    (root / "sys/module/foo").mkdir(parents=True)
    (root / "sys/module/foo/version").write_text("2.0\n")
    for i in range(3):
        entry = root / "sys/class/foo" / f"foo{i}"
        entry.mkdir(parents=True)
        (entry / "dev").write_text(f"240:{i}\n")
        (root / "dev" / f"foo{i}").write_text("")


async def test_driver_process_publishes_and_stops_on_sigterm(
    sandbox: testing.RunningSandbox, kmm_api: kube_client.Client, root: pathlib.Path
) -> None:
    fake_tree(root)
    node = sandbox.node_names[-1]
    driver = f"foo-{uuid.uuid4().hex[:6]}.example.com"
    api = kmm_api
    selector = {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from kmm.cli import main; main()",
        "driver",
        f"--node={node}",
        f"--driver-name={driver}",
        "--module=foo",
        "--device-class=foo",
        f"--root={root}",
        f"--kubeconfig={sandbox.kubeconfig}",
        stderr=asyncio.subprocess.PIPE,
    )
    paths = plugins.Paths.under(root, driver)
    try:
        for _ in range(600):
            listing = await api.request("GET", resources.RESOURCE_SLICES.path(), query=selector)
            if listing["items"]:
                break
            await asyncio.sleep(0.1)
        (published,) = listing["items"]
        assert published["spec"]["pool"]["name"] == node
        devices = {d["name"]: d["attributes"] for d in published["spec"]["devices"]}
        assert sorted(devices) == ["foo0", "foo1", "foo2"]
        assert devices["foo2"]["minor"] == {"int": 2}
        assert devices["foo0"]["moduleVersion"] == {"string": "2.0"}
        assert paths.dra_socket.exists()
        assert paths.registration_socket(driver).exists()
        process.terminate()
        assert process.stderr is not None
        output = await asyncio.wait_for(process.stderr.read(), timeout=60)
        assert await process.wait() == 0, output.decode()
        assert b"driver stopped: SIGTERM" in output
        assert not paths.dra_socket.exists()
        assert not paths.registration_socket(driver).exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        listing = await api.request("GET", resources.RESOURCE_SLICES.path(), query=selector)
        for item in listing["items"]:
            await api.request(
                "DELETE", resources.RESOURCE_SLICES.path(name=item["metadata"]["name"])
            )
