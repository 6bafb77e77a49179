"""Many streams under simulation (`rsub_dev.sim.scale`): the runtime wired for several
streams leads and snapshots every one of them, and the simulated JetStream's work per
operation does not grow with the streams it holds (counted, not timed)."""

from __future__ import annotations

import asyncio

import pytest

from rsub_dev.sim.scale import ScaleParams, ScaleWorld
from rsub_dev.simjs import ManualClock, SimJetStream, SourceConfig, StreamConfig
from rsub_dev.simjs.sourcing import Link
from rsub_dev.simjs.stream import Stream


def test_every_stream_is_led_and_snapshotted() -> None:
    """Each region's one replica leads all the shards, and hands that to every stream of
    each; once data comes, every stream completes snapshots in its region."""
    seen: dict[str, object] = {}

    async def phases(world: ScaleWorld) -> None:
        await asyncio.sleep(3)
        seen["leaders"] = {
            s.name: sum(d.machine is not None and d.machine.is_leader for d in s.drivers.values())
            for s in world.sidecars
        }
        region = world.streams[0].regions[0]
        for _ in range(4):
            world.publish(region, world.streams)
            await asyncio.sleep(1)
        completed: dict[str, float] = {}
        for metric in world.metrics["r0-0"].registry.collect():
            for sample in metric.samples:
                if sample.name == "rsub_snapshots_completed_total":
                    completed[sample.labels["stream"]] = sample.value
        seen["completed"] = completed

    world = ScaleWorld(7, ScaleParams(streams=12, durables=2), phases)
    world.run_quiet()
    assert seen["leaders"] == {"r0-0": 12, "r1-0": 12}
    completed = seen["completed"]
    assert isinstance(completed, dict)
    assert sorted(completed) == sorted(vs.name for vs in world.streams)
    assert min(completed.values()) >= 2


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times a stream is asked whether it takes a subject, and a link for its
    next message."""
    calls = {"takes": 0, "next_message": 0}
    takes, next_message = Stream.takes, Link.next_message

    def counted_takes(self: Stream, subject: str) -> bool:
        calls["takes"] += 1
        return takes(self, subject)

    def counted_next(self: Link, origin: Stream) -> object:
        calls["next_message"] += 1
        return next_message(self, origin)

    monkeypatch.setattr(Stream, "takes", counted_takes)
    monkeypatch.setattr(Link, "next_message", counted_next)
    return calls


@pytest.mark.parametrize("streams", [10, 1_000])
def test_a_publish_and_its_sourcing_visit_one_stream_and_its_links(
    streams: int, counted: dict[str, int]
) -> None:
    clock = ManualClock()
    js = SimJetStream(clock)
    for i in range(streams):
        js.stream_create(StreamConfig(f"w{i}", (f"s{i}.>",)))
        js.stream_create(StreamConfig(f"r{i}", (f"_r{i}",), sources=(SourceConfig(f"w{i}"),)))
    js.settle()
    counted.update(takes=0, next_message=0)
    js.publish(f"s{streams - 1}.x", b"x")
    clock.advance(1)
    js.settle()
    # The one stream that takes it, the one link that carries it (asked again once empty).
    assert counted == {"takes": 1, "next_message": 3}
    assert js.stream(f"r{streams - 1}").last_seq == 1
