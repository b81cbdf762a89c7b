"""ApiLeases on the wire: paths, bodies, and how 404 / 409 / 5xx come back.

The server below answers from a script; it knows nothing of Lease semantics.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import kubeclients
import pytest
from aiohttp import test_utils, web

from kmm.kube import errors
from kmm.runtime import leaderelection

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class Scripted:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.seen: list[tuple[str, str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, request.path, body))
        code, answer = self.answers.pop(0)
        return web.json_response(answer, status=code)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Scripted, leaderelection.ApiLeases]]:
    scripted = Scripted()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", scripted.handle)
    server = test_utils.TestServer(app)
    await server.start_server()
    api = kubeclients.for_server(str(server.make_url("")), max_attempts=1)
    try:
        yield scripted, leaderelection.ApiLeases(api)
    finally:
        await api.close()
        await server.close()


def lease_json(holder: str, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lock", "namespace": "ns", "resourceVersion": rv},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-01T00:00:00.000000Z",
            "renewTime": "2026-01-01T00:00:02.500000Z",
            "leaseTransitions": 2,
        },
    }


async def test_get_create_update_and_conflicts(
    setup: tuple[Scripted, leaderelection.ApiLeases],
) -> None:
    scripted, leases = setup
    not_found = {"kind": "Status", "code": 404, "reason": "NotFound"}
    conflict = {"kind": "Status", "code": 409, "reason": "Conflict"}
    scripted.answers = [
        (404, not_found),
        (201, lease_json("a", "5")),
        (200, lease_json("a", "6")),
        (409, conflict),
        (409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"}),
        (500, {"kind": "Status", "code": 500}),
    ]
    assert await leases.get("ns", "lock") is None
    record = leaderelection.LeaseRecord("a", 15, T0, T0, 0)
    created = await leases.create("ns", "lock", record)
    assert created.resource_version == "5"
    assert created.renew_time == T0 + datetime.timedelta(seconds=2.5)
    assert created.lease_transitions == 2
    updated = await leases.update("ns", "lock", created)
    assert updated.resource_version == "6"
    with pytest.raises(errors.Conflict):
        await leases.update("ns", "lock", created)
    with pytest.raises(errors.Conflict) as exists:
        await leases.create("ns", "lock", record)
    assert exists.value.already_exists
    with pytest.raises(errors.Unavailable) as failure:
        await leases.get("ns", "lock")
    assert failure.value.status == 500

    methods = [(m, p) for m, p, _ in scripted.seen]
    assert methods == [
        ("GET", f"{LEASE_PATH}/lock"),
        ("POST", LEASE_PATH),
        ("PUT", f"{LEASE_PATH}/lock"),
        ("PUT", f"{LEASE_PATH}/lock"),
        ("POST", LEASE_PATH),
        ("GET", f"{LEASE_PATH}/lock"),
    ]
    put_body = scripted.seen[2][2]
    assert put_body["metadata"] == {"name": "lock", "namespace": "ns", "resourceVersion": "5"}
    assert put_body["spec"]["holderIdentity"] == "a"
    assert "resourceVersion" not in scripted.seen[1][2]["metadata"]
