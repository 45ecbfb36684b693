"""The JSON-gateway client against a real etcd: keys, guarded transactions, leases, watches, outages."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.group.etcd import Compare, DeletePrefix, EtcdClient, EtcdSettings, EtcdUnavailable, Event, Put
from tests.etcd.support import EtcdServer, free_port
from tests.support.wait import wait_until

pytestmark = pytest.mark.etcd


async def test_put_get_and_prefix_read_back_text(etcd: EtcdServer) -> None:
    """What is put under a prefix reads back as text, key by key and as a sorted prefix."""
    async with EtcdClient(EtcdSettings((etcd.url,))) as client:
        await client.put("/g/a/2", "two")
        await client.put("/g/a/1", "one")
        kv, revision = await client.get("/g/a/1")
        assert kv is not None and kv.value == "one" and revision >= kv.mod_revision
        kvs, _ = await client.get_prefix("/g/a/")
        assert [(k.key, k.value) for k in kvs] == [("/g/a/1", "one"), ("/g/a/2", "two")]
        assert (await client.get("/g/none"))[0] is None


async def test_txn_applies_only_while_the_guard_holds(etcd: EtcdServer) -> None:
    """A transaction guarded on a key's revision succeeds once; the same guard then fails."""
    async with EtcdClient(EtcdSettings((etcd.url,))) as client:
        assert await client.txn([Compare("/g/gen", 0)], [Put("/g/gen", "1"), Put("/g/r/0", "x")])
        kv, _ = await client.get("/g/gen")
        assert kv is not None
        ops = [Put("/g/gen", "2"), DeletePrefix("/g/r/")]
        assert await client.txn([Compare("/g/gen", kv.mod_revision)], ops)
        assert not await client.txn([Compare("/g/gen", kv.mod_revision)], [Put("/g/gen", "3")])
        assert (await client.get("/g/gen"))[0].value == "2"  # type: ignore[union-attr]
        assert (await client.get_prefix("/g/r/"))[0] == []


async def test_a_key_on_an_expired_lease_disappears_and_keepalive_reports_it(etcd: EtcdServer) -> None:
    """A key attached to a lease that is not kept alive vanishes; keepalive then answers TTL 0."""
    async with EtcdClient(EtcdSettings((etcd.url,))) as client:
        lease = await client.grant(2)
        assert await client.keepalive(lease) > 0
        await client.put("/g/m/1", "alive", lease)

        async def gone() -> bool:
            return (await client.get("/g/m/1"))[0] is None

        await wait_until(gone, 15, "the leased key gone with its lease", interval=0.2)
        assert await client.keepalive(lease) == 0


async def test_watch_streams_puts_and_deletes_in_order(etcd: EtcdServer) -> None:
    """A watch on a prefix yields each put and delete under it, from the revision asked for."""
    async with EtcdClient(EtcdSettings((etcd.url,))) as client:
        _, revision = await client.get_prefix("/w/")
        seen: list[Event] = []

        async def collect() -> None:
            async for batch in client.watch("/w/", revision + 1):
                seen.extend(batch)
                if len(seen) >= 3:
                    return

        task = asyncio.create_task(collect())
        await client.put("/w/a", "1")
        await client.put("/other", "ignored")
        lease = await client.grant(5)
        await client.put("/w/b", "2", lease)
        await client.revoke(lease)
        await asyncio.wait_for(task, 15)
        assert [(e.kind, e.kv.key, e.kv.value) for e in seen] == [
            ("put", "/w/a", "1"),
            ("put", "/w/b", "2"),
            ("delete", "/w/b", ""),
        ]


async def test_an_unreachable_etcd_raises_one_exception_within_the_timeout() -> None:
    """With no etcd listening, every call fails with EtcdUnavailable, naming the call, not hanging."""
    settings = EtcdSettings((f"http://127.0.0.1:{free_port()}",), timeout_s=1.0, password="s3cret-pw")
    async with EtcdClient(settings) as client:
        with pytest.raises(EtcdUnavailable, match="/v3/kv/range") as info:
            await asyncio.wait_for(client.get("/g/x"), 10)
        assert "s3cret-pw" not in str(info.value)
        assert "s3cret-pw" not in repr(settings)


async def test_the_second_endpoint_answers_when_the_first_is_down(etcd: EtcdServer) -> None:
    """A dead first endpoint is skipped: the call succeeds on the next one."""
    dead = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient(EtcdSettings((dead, etcd.url), timeout_s=1.0)) as client:
        await client.put("/e/k", "v")
        assert (await client.get("/e/k"))[0] is not None
