"""Wait for a component's health endpoint, failing fast if the process dies.

The endpoint is asked through ``kube.client`` like every other request kmm
makes; ``access`` says how to reach it (the admin certificate for the API
server, no verification for the self-signed controller-manager and
scheduler, plain HTTP for etcd and KWOK).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse

from kmm.kube import client, errors, kubeconfigs
from kmm.sandbox import errors as sandbox_errors
from kmm.sandbox import processes

__all__ = ["server_of", "wait_healthy"]


def server_of(url: str) -> str:
    """``https://127.0.0.1:6443/readyz`` -> ``https://127.0.0.1:6443``."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def wait_healthy(
    process: processes.Process,
    *,
    timeout: float,
    access: kubeconfigs.Access | None = None,
) -> None:
    """Poll the process's health URL until it answers 2xx; raise ComponentFailed
    if the process exits first or the endpoint stays unhealthy past ``timeout``."""
    url = process.health_url
    parts = urllib.parse.urlsplit(url)
    access = access or kubeconfigs.Access(server=server_of(url), source=process.name)
    deadline = time.monotonic() + timeout
    last_problem = "no answer yet"
    # One attempt per poll: this loop is the retry.
    async with client.Client(access, timeout=5.0, max_attempts=1) as probe:
        while True:
            if not process.alive():
                raise sandbox_errors.ComponentFailed(
                    process.name,
                    "exited during start",
                    process.log,
                    processes.log_tail(process.log),
                )
            try:
                await probe.request("GET", parts.path or "/")
                return
            except errors.ApiError as err:
                last_problem = str(err)
            if time.monotonic() > deadline:
                raise sandbox_errors.ComponentFailed(
                    process.name,
                    f"did not become healthy within {timeout:.0f} s at {url} ({last_problem})",
                    process.log,
                    processes.log_tail(process.log),
                )
            await asyncio.sleep(0.2)
