"""The leadership lease against a real JetStream server (clocks injected, no sleeping)."""

from __future__ import annotations

import uuid

import nats
import pytest
import structlog
from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from sidecar.nats.lease import Lease, LeaseState
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort, KeyValueBucket
from sidecar.nats.regional_kv import open_regional_kv
from tests.support.clocks import HandClock
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

TTL = 6.0


@pytest.fixture
async def kv(port: JetStreamPort) -> KeyValueBucket:
    return await open_regional_kv(port, f"lease-{uuid.uuid4().hex[:8]}", "west")


async def test_bucket_is_placed_in_the_region_and_reopening_is_idempotent(
    js: JetStreamContext, port: JetStreamPort
) -> None:
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    await open_regional_kv(port, bucket, "west")
    again = await open_regional_kv(port, bucket, "west")
    info = await js.stream_info(f"KV_{bucket}")
    assert info.config.placement is not None
    assert info.config.placement.cluster == "west"
    assert info.config.max_msgs_per_subject == 1
    assert info.config.subjects == [f"$KV.{bucket}.>"]
    assert await again.put("k", b"v") > 0


async def test_fewer_replicas_than_wanted_warn_only_when_a_count_was_configured(
    js: JetStreamContext, port: JetStreamPort
) -> None:
    """A stand-alone server places one replica. Unconfigured (as many as the cluster places),
    that is what a one-server region is: info. Configured, it is a fault: warning."""
    bucket = f"lease-{uuid.uuid4().hex[:8]}"

    async def levels(replicas: int | None) -> dict[str, str]:
        with structlog.testing.capture_logs() as events:
            await open_regional_kv(port, bucket, "west", replicas=replicas)
        return {e["event"]: e["log_level"] for e in events if "replicas" in e["event"]}

    assert await levels(None) == {"kv_bucket_replicas_reduced": "info"}
    assert await levels(None) == {"kv_bucket_replicas_low": "info"}
    assert await levels(3) == {"kv_bucket_replicas_low": "warning"}
    assert await levels(1) == {}
    assert (await js.stream_info(f"KV_{bucket}")).config.num_replicas == 1


async def test_first_candidate_acquires_second_follows_and_renewal_keeps_epoch(
    kv: KeyValueBucket,
) -> None:
    changes: list[LeaseState] = []
    a = Lease(kv, "a", TTL, clock=HandClock(), on_change=changes.append)
    b = Lease(kv, "b", TTL, clock=HandClock())
    await a.step()
    assert a.is_leader and a.epoch > 0
    await b.step()
    assert not b.is_leader and b.epoch == 0 and b.state.holder == "a"
    epoch = a.epoch
    # The follower knows the leader's epoch, before a renewal (the lease's revision) and after.
    assert b.state.leader_epoch == epoch
    await a.step()
    await a.step()
    assert a.is_leader and a.epoch == epoch
    await b.step()
    assert b.state.leader_epoch == epoch == a.state.leader_epoch
    assert changes == [LeaseState(True, epoch, "a", epoch)]


async def test_expired_lease_is_taken_over_with_a_higher_epoch(kv: KeyValueBucket) -> None:
    clock_a, clock_b = HandClock(), HandClock()
    a = Lease(kv, "a", TTL, clock=clock_a)
    b = Lease(kv, "b", TTL, clock=clock_b)
    await a.step()
    first = a.epoch
    await b.step()  # b starts watching the revision
    clock_b.now += TTL
    await b.step()
    assert b.is_leader and b.epoch > first
    # a did not notice yet (its clock stood still); its next renewal fails on the revision.
    await a.step()
    assert not a.is_leader and a.epoch == 0
    assert a.state.holder is None
    await a.step()
    assert a.state.holder == "b"


async def test_renewals_prevent_takeover(kv: KeyValueBucket) -> None:
    clock_a, clock_b = HandClock(), HandClock()
    a = Lease(kv, "a", TTL, clock=clock_a)
    b = Lease(kv, "b", TTL, clock=clock_b)
    await a.step()
    for _ in range(4):
        await b.step()
        clock_a.now += TTL / 3
        clock_b.now += TTL * 0.9
        await a.step()
    await b.step()
    assert a.is_leader and not b.is_leader


async def test_leader_that_cannot_renew_in_time_stops_leading(kv: KeyValueBucket) -> None:
    clock = HandClock()
    a = Lease(kv, "a", TTL, clock=clock)
    await a.step()
    clock.now += TTL * 0.8
    assert not a.is_leader and a.epoch == 0


async def test_release_lets_a_follower_acquire_at_once(kv: KeyValueBucket) -> None:
    a = Lease(kv, "a", TTL, clock=HandClock())
    b = Lease(kv, "b", TTL, clock=HandClock())
    await a.step()
    first = a.epoch
    await b.step()
    await a.release()
    assert not a.is_leader
    await b.step()
    assert b.is_leader and b.epoch > first


async def test_ttl_must_be_positive(kv: KeyValueBucket) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        Lease(kv, "a", 0)


async def test_a_watching_lease_never_acquires_but_measures_expiry(kv: KeyValueBucket) -> None:
    clock_a, clock_b = HandClock(), HandClock()
    a = Lease(kv, "a", TTL, key="shards.3", extra={"shards": 8}, clock=clock_a)
    b = Lease(kv, "b", TTL, key="shards.3", clock=clock_b)
    await b.step(acquire=False)
    assert not b.is_leader and b.state.holder is None  # free, and left free
    await a.step()
    await b.step(acquire=False)
    assert b.state.holder == "a" and b.extra == {"shards": 8} and a.extra == {"shards": 8}
    clock_b.now += TTL
    await b.step(acquire=False)
    assert not b.is_leader  # expired, but b only watches
    # Allowed to acquire, b takes the expired lease at once: it has watched for a whole ttl.
    await b.step()
    assert b.is_leader and b.epoch > a.state.epoch
    # Another key of the same bucket is another lease.
    other = Lease(kv, "a", TTL, key="shards.4", clock=clock_a)
    await other.step()
    assert other.is_leader and other.epoch > b.epoch


async def test_a_lease_that_expires_while_the_bucket_is_unreachable_is_reported_lost(
    js_server: LoneServer,
) -> None:
    # Found when NATS stopped under two replicas: the shard leases kept reporting `leader`
    # (metric and machine) because a round that failed never told the observer.
    own = await nats.connect(js_server.url)
    bucket = await open_regional_kv(NatsPort(own), f"lease-{uuid.uuid4().hex[:8]}", "west")
    clock, changes = HandClock(), list[LeaseState]()
    lease = Lease(bucket, "a", TTL, clock=clock, on_change=changes.append)
    await lease.step()
    assert lease.is_leader
    await own.close()
    clock.now += TTL
    with pytest.raises(NatsError):
        await lease.step()
    assert not lease.is_leader
    assert changes[-1] == LeaseState(False, 0, None, 0)
