"""The ResourceClaim informer: list+watch, GET only on a miss (requests counted)."""

from __future__ import annotations

import asyncio

import pytest

from kmm.aio import backoff
from kmm.kube import client
from kmm.kubeletplugin import claimcache, claims, errors

from . import fakeapi, fakes


def ref(claim: claims.ResourceClaim) -> claims.ClaimRef:
    return claims.ref_of(claim)


async def wait_until_cached(cache: claimcache.ClaimCache, claim: claims.ResourceClaim) -> None:
    r = ref(claim)
    for _ in range(1000):
        cached = cache.cached(r.namespace, r.name)
        if (
            cached is not None
            and cached["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
        ):
            return
        await asyncio.sleep(0.005)
    pytest.fail("the watch never delivered the claim")


async def test_warm_cache_answers_without_api_calls(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    listed = fakes.make_claim("listed")
    fake_api.put_claim(listed)
    reported: list[BaseException] = []
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: reported.append(e))
    await cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), timeout=10)
        await fake_api.wait_for_watch()
        watched = fakes.make_claim("watched")
        fake_api.put_claim(watched)
        await wait_until_cached(cache, watched)
        before = api.counter.total
        for _ in range(10):
            assert (await cache.get(ref(listed)))["metadata"]["name"] == "listed"
            assert (await cache.get(ref(watched)))["metadata"]["name"] == "watched"
        assert api.counter.total == before
        assert cache.misses == 0
    finally:
        await cache.stop()
    assert reported == []


async def test_miss_gets_once_then_hits(api: client.Client, fake_api: fakeapi.FakeAPI) -> None:
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: None)
    claim = fakes.make_claim("late")
    fake_api.put_claim(claim, notify=False)  # the watch has not delivered it yet
    assert (await cache.get(ref(claim)))["metadata"]["uid"] == claim["metadata"]["uid"]
    assert fake_api.requests["GET"] == 1
    await cache.get(ref(claim))
    assert fake_api.requests["GET"] == 1
    assert cache.misses == 1


async def test_unallocated_copy_counts_as_a_miss(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: None)
    claim = fakes.make_claim("c")
    bare = {**claim, "status": {}}
    cache._store(bare)  # the cache saw the claim before the scheduler allocated it
    fake_api.put_claim(claim, notify=False)
    got = await cache.get(ref(claim))
    assert claims.is_allocated(got)
    assert cache.misses == 1


async def test_uid_mismatch_and_missing_claim_fail(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    cache = claimcache.ClaimCache(api, on_error=lambda e, m: None)
    claim = fakes.make_claim("c")
    fake_api.put_claim(claim, notify=False)
    with pytest.raises(errors.ClaimNotFoundError):
        await cache.get(claims.ClaimRef("default", "c", claims.ClaimUID("other-uid")))
    with pytest.raises(errors.ClaimNotFoundError):
        await cache.get(claims.ClaimRef("default", "gone", claims.ClaimUID("x")))


async def test_static_claims_counts_lookups() -> None:
    claim = fakes.make_claim("s")
    source = claimcache.StaticClaims([claim])
    assert await source.get(ref(claim)) is claim
    source.delete("default", "s")
    with pytest.raises(errors.ClaimNotFoundError):
        await source.get(ref(claim))
    assert source.gets == 2


async def test_watch_end_and_expiry_are_survived(
    api: client.Client, fake_api: fakeapi.FakeAPI
) -> None:
    reported: list[BaseException] = []
    cache = claimcache.ClaimCache(
        api,
        on_error=lambda e, m: reported.append(e),
        delays=backoff.Backoff(initial=0.0, jitter=0.0),
    )
    await cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), timeout=10)
        await fake_api.wait_for_watch()
        fake_api.end_watches()  # the server ends a watch: re-watch from the last version
        for _ in range(2000):
            if fake_api.requests["WATCH"] == 2 and fake_api._watchers:
                break
            await asyncio.sleep(0.005)
        assert fake_api.requests["WATCH"] == 2
        assert fake_api.requests["GET"] == 1  # no relist for a clean end
        for queue in fake_api._watchers:  # history expired: relist
            queue.put_nowait({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
        for _ in range(2000):
            if fake_api.requests["GET"] == 2 and fake_api._watchers:
                break
            await asyncio.sleep(0.005)
        assert fake_api.requests["GET"] == 2
        later = fakes.make_claim("later")
        fake_api.put_claim(later)
        await wait_until_cached(cache, later)
    finally:
        await cache.stop()
    assert reported == []  # an ended watch and an expired version are routine
