"""The plugin under hostile gRPC input, over its real unix socket.

Claim references come from outside (the kubelet, or whatever can reach the
socket). Whatever they hold - empty, huge, path-like, duplicated, odd
Unicode - every claim gets an answer, the plugin keeps serving, and nothing
is written outside its CDI directory and its own data directory. A request
that is not even a valid protobuf message fails as a whole (as Go's server
would), and the next call is served.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmm.kubeletplugin import claimcache, claims, plugins
from kmm.kubeletplugin.protos import dra_v1_pb2

from . import fakes
from .kubelet import Kubelet

# What a reference may hold: plain names, and what should never be trusted.
HOSTILE = st.one_of(
    st.sampled_from(["", ".", "..", "../../etc", "a/b", "/abs", "x" * 300, "é", "\u0000", "-"]),
    st.text(max_size=80),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
)
REFS = st.lists(st.tuples(HOSTILE, HOSTILE, HOSTILE), min_size=1, max_size=12)


def files_under(root: pathlib.Path) -> set[pathlib.Path]:
    return {p for p in root.rglob("*") if not p.is_dir()}


async def exercise(raw: list[tuple[str, str, str]]) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="kh", dir="/tmp"))
    try:
        source = claimcache.StaticClaims()
        refs = [claims.ClaimRef(ns, name, claims.ClaimUID(uid)) for ns, name, uid in raw]
        refs += refs[:2]  # duplicates in one call
        for ref in refs[::2]:  # half of them even exist, allocated to us
            claim = fakes.make_claim("c", devices=("dev0",))
            claim["metadata"].update(namespace=ref.namespace, name=ref.name, uid=ref.uid)
            source.put(claim)
        good = fakes.make_claim("good")
        source.put(good)
        plugin = plugins.Plugin(
            fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
            claim_source=source, paths=plugins.Paths.under(root, fakes.DRIVER), stop_grace=5,
        )  # fmt: skip
        await plugin.start()
        plugin.allow_claims()
        try:
            async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
                prepared = await kubelet.prepare(good, *refs)
                assert set(prepared) == {good["metadata"]["uid"]} | {r.uid for r in refs}
                assert prepared[good["metadata"]["uid"]].error == ""
                unprepared = await kubelet.unprepare(good, *refs)
                assert set(unprepared) == set(prepared)
                assert unprepared[good["metadata"]["uid"]] == ""
                # Still serving: the same claim again, from scratch.
                assert (await kubelet.prepare(good))[good["metadata"]["uid"]].error == ""
        finally:
            await plugin.stop()
        allowed = (plugin.paths.cdi_dir, plugin.paths.plugin_data_dir, plugin.paths.registrar_dir)
        for path in files_under(root):
            assert any(path.is_relative_to(d) for d in allowed), path
        for spec in plugin.paths.cdi_dir.iterdir():
            assert spec.name.startswith(f"{fakes.DRIVER}-claim_"), spec
    finally:
        shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=REFS)
def test_every_claim_is_answered_and_nothing_lands_outside(raw: list[tuple[str, str, str]]) -> None:
    asyncio.run(exercise(raw))


async def test_ten_thousand_unknown_claims_in_one_call(root: pathlib.Path) -> None:
    plugin = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
        claim_source=claimcache.StaticClaims(), paths=plugins.Paths.under(root, fakes.DRIVER),
    )  # fmt: skip
    await plugin.start()
    plugin.allow_claims()
    refs = [
        claims.ClaimRef("ns", f"c{i}", claims.ClaimUID(str(uuid.uuid4()))) for i in range(10_000)
    ]
    try:
        async with Kubelet(plugin.paths.registration_socket(fakes.DRIVER)) as kubelet:
            answers = await kubelet.prepare(*refs)
            assert len(answers) == 10_000
            assert all("not found" in a.error for a in answers.values())
            assert set((await kubelet.unprepare(*refs)).values()) == {""}
    finally:
        await plugin.stop()
    assert plugin.prepared() == {}


async def test_a_request_that_is_not_protobuf_fails_alone(root: pathlib.Path) -> None:
    plugin = plugins.Plugin(
        fakes.DRIVER, node=fakes.NODE, owner=fakes.FakeOwner(), policy=fakes.FakePolicy(),
        claim_source=claimcache.StaticClaims([fakes.make_claim("good")]),
        paths=plugins.Paths.under(root, fakes.DRIVER),
    )  # fmt: skip
    await plugin.start()
    plugin.allow_claims()
    try:
        async with grpc.aio.insecure_channel(f"unix://{plugin.paths.dra_socket}") as channel:
            raw = channel.unary_unary(
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                request_serializer=lambda b: b,
                response_deserializer=dra_v1_pb2.NodePrepareResourcesResponse.FromString,
            )
            # Field 1 (claims), a Claim whose namespace is not UTF-8.
            bad = b"\x0a\x04\x0a\x02\xff\xfe"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw(bad, timeout=10)
            assert refused.value.code() != grpc.StatusCode.OK
            good = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="default", name="good", uid="x")]
            )
            answer = await raw(good.SerializeToString(), timeout=10)
            assert list(answer.claims) == ["x"]  # served (a UID mismatch, answered)
    finally:
        await plugin.stop()
