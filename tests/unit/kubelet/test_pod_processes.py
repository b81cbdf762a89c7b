"""One pod's containers as local processes (kmm.kubelet.processes), without a cluster.

The pods here mount no service account token and read no ConfigMap, so the
API client is never called.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kmm.kube import errors
from kmm.kubelet import processes

IMAGE = "kmm.example/kmm:test"


class NoApi:
    async def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no API call expected")


def settings(tmp_path: Path) -> processes.Settings:
    return processes.Settings(
        api=NoApi(),  # type: ignore[arg-type]
        root=tmp_path / "root",
        state_dir=tmp_path / "state",
        server="https://127.0.0.1:6443",
        process_image=IMAGE,
        backoff=0.05,
    )


def pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "initContainers": init or [],
            "containers": containers,
            **spec,
        },
    }


def sh(name: str, script: str, image: str = IMAGE) -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["sh", "-c", script]}


async def finish(run: processes.PodRun) -> None:
    run.start()
    await asyncio.wait_for(run.done.wait(), timeout=30)


async def test_init_containers_run_in_order_before_the_containers(tmp_path: Path) -> None:
    order = tmp_path / "order"
    run = processes.PodRun(
        pod(
            [sh("main", f"echo main >> {order}")],
            init=[sh("first", f"echo first >> {order}"), sh("second", f"echo second >> {order}")],
        ),
        settings(tmp_path),
        lambda: None,
    )
    await finish(run)
    assert order.read_text().split() == ["first", "second", "main"]
    assert run.phase == "Succeeded"
    assert run.initialized
    assert [s["state"]["terminated"]["reason"] for s in run.statuses(init=True)] == [
        "Completed",
        "Completed",
    ]


async def test_a_failed_init_container_fails_a_never_pod_and_nothing_else_starts(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    run = processes.PodRun(
        pod([sh("main", f"touch {marker}")], init=[sh("init", "exit 7")]),
        settings(tmp_path),
        lambda: None,
    )
    await finish(run)
    assert run.phase == "Failed"
    assert not marker.exists()
    (init,) = run.statuses(init=True)
    assert init["state"]["terminated"]["exitCode"] == 7


async def test_one_failing_container_fails_the_pod_and_the_log_is_kept(tmp_path: Path) -> None:
    run = processes.PodRun(
        pod([sh("ok", "echo fine"), sh("bad", "echo broken >&2; exit 1")]),
        settings(tmp_path),
        lambda: None,
    )
    await finish(run)
    assert run.phase == "Failed"
    codes = {s["name"]: s["state"]["terminated"]["exitCode"] for s in run.statuses()}
    assert codes == {"ok": 0, "bad": 1}
    assert (tmp_path / "root/var/log/pods/ns_p_u1/bad/0.log").read_text() == "broken\n"


async def test_on_failure_restarts_until_it_succeeds(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    script = f"echo x >> {counter}; test $(wc -l < {counter}) -ge 3"
    run = processes.PodRun(
        pod([sh("main", script)], restartPolicy="OnFailure"), settings(tmp_path), lambda: None
    )
    await finish(run)
    assert run.phase == "Succeeded"
    (status,) = run.statuses()
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 1


async def test_stop_sends_sigterm_then_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    said = tmp_path / "said"
    script = f"trap 'echo TERM >> {said}' TERM; echo up >> {said}; while true; do sleep 0.05; done"
    run = processes.PodRun(pod([sh("main", script)]), settings(tmp_path), lambda: None)
    run.start()
    for _ in range(200):
        if said.exists():
            break
        await asyncio.sleep(0.05)
    await asyncio.wait_for(run.stop(0.5), timeout=30)
    assert said.read_text().split() == ["up", "TERM"]  # it saw TERM, ignored it, was killed
    (status,) = run.statuses()
    assert status["state"]["terminated"]["exitCode"] == 128 + 9
    assert run.stopped


async def test_containers_of_other_images_run_without_a_process_until_stopped(
    tmp_path: Path,
) -> None:
    run = processes.PodRun(
        pod([sh("app", "exit 1", image="example.com/app:1")], restartPolicy="Always"),
        settings(tmp_path),
        lambda: None,
    )
    run.start()
    await asyncio.sleep(0.2)
    assert run.phase == "Running"
    assert run.ready
    await run.stop(30)
    assert run.stopped


async def test_a_command_that_cannot_start_is_a_start_error_exit(tmp_path: Path) -> None:
    run = processes.PodRun(
        pod([{"name": "main", "image": IMAGE, "command": ["/no/such/program"]}]),
        settings(tmp_path),
        lambda: None,
    )
    await finish(run)
    assert run.phase == "Failed"
    (status,) = run.statuses()
    assert status["state"]["terminated"]["exitCode"] == 128
    assert status["state"]["terminated"]["reason"] == "StartError"


async def test_a_missing_configmap_keeps_the_container_waiting_not_failed(tmp_path: Path) -> None:
    class MissingConfigMap:
        async def request(self, method: str, path: str, **kwargs: Any) -> Any:
            raise errors.NotFound(404, "not found", method=method, path=path)

    found = processes.Settings(
        api=MissingConfigMap(),  # type: ignore[arg-type]
        root=tmp_path / "root",
        state_dir=tmp_path / "state",
        server="https://127.0.0.1:6443",
        process_image=IMAGE,
        backoff=0.05,
    )
    container = sh("main", "true")
    container["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}
    ]
    run = processes.PodRun(pod([container]), found, lambda: None)
    run.start()
    await asyncio.sleep(0.5)
    assert not run.done.is_set()
    assert run.phase == "Pending"
    (status,) = run.statuses()
    assert status["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    await run.stop(0)
