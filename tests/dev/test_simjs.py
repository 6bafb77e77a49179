"""The simulated JetStream alone: its edges (de-duplication windows, transforms, sourcing
delays, stalls and partitions, TTLs, faults, determinism). What it shares with a real server
is checked against one in test_simjs_conformance.py."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ServiceUnavailableError,
)

from rsub_dev.simjs import (
    NEEDS_META,
    ConsumerConfig,
    Fault,
    ManualClock,
    Op,
    SimJetStream,
    SimJSError,
    SourceConfig,
    StreamConfig,
    SubjectTransform,
    stream_identity,
)
from rsub_dev.simjs.clock import rfc3339_nano
from rsub_dev.simjs.errors import CLUSTER_NOT_AVAILABLE, CONSUMER_NOT_FOUND
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.port import STREAM_NOT_FOUND

MSG_ID = "Nats-Msg-Id"


def world(start_ms: int = 0, seed: int = 0) -> tuple[ManualClock, SimJetStream]:
    clock = ManualClock(start_ms)
    return clock, SimJetStream(clock, rng=random.Random(seed))


# ---- time and identity ------------------------------------------------------------------


def test_creation_times_are_written_as_go_writes_them_and_hashed_as_the_server_does() -> None:
    assert rfc3339_nano(0) == "1970-01-01T00:00:00Z"
    assert rfc3339_nano(1_500_000_000) == "1970-01-01T00:00:01.5Z"
    assert rfc3339_nano(1_764_212_484_302_992_057) == "2025-11-27T03:01:24.302992057Z"
    # Seen on nats-server 2.15.1: a stream created at this time was named so in the
    # `Nats-Stream-Source` of the messages it sourced out.
    assert stream_identity("2026-11-27T03:01:24.302992057Z") == "xxNHnjqA"


class SettableClock:
    """A clock a test sets at will, even backwards (a broken one)."""

    def __init__(self) -> None:
        self.now = 1_000

    def now_ms(self) -> int:
        return self.now


def test_the_clock_only_moves_forward_and_the_model_notices_if_it_did_not() -> None:
    manual = ManualClock(1_000)
    with pytest.raises(ValueError, match="forward"):
        manual.advance(-1)
    with pytest.raises(ValueError, match="forward"):
        manual.set(999)
    clock = SettableClock()
    js = SimJetStream(clock)
    js.stream_create(StreamConfig("S", ("s",)))
    clock.now = 500
    with pytest.raises(RuntimeError, match="went back"):
        js.publish("s")


def test_streams_created_in_the_same_millisecond_have_different_identities() -> None:
    _, js = world(5)
    a = js.stream_create(StreamConfig("A", ("a",)))
    b = js.stream_create(StreamConfig("B", ("b",)))
    assert a.created != b.created
    assert js.stream("A").identity == stream_identity(a.created)


# ---- publishing: de-duplication and expected headers ----------------------------------------


def test_a_message_id_is_a_duplicate_within_the_window_and_new_from_its_end_on() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("S", ("s",), duplicate_window_ms=500))
    assert js.publish("s", b"1", {MSG_ID: "x"}).seq == 1
    clock.advance(499)
    again = js.publish("s", b"2", {MSG_ID: "x"})
    assert (again.seq, again.duplicate) == (1, True)
    clock.advance(1)  # 500 ms after the first: the id is forgotten (a duplicate does not renew it)
    assert js.publish("s", b"3", {MSG_ID: "x"}).seq == 2
    assert js.stream_info("S").state.messages == 2


@pytest.mark.parametrize(
    ("config", "window_ms"),
    [
        (StreamConfig("S"), 120_000),
        (StreamConfig("S", duplicate_window_ms=0), 120_000),
        (StreamConfig("S", max_age_ms=30_000), 30_000),
        (StreamConfig("S", sources=(SourceConfig("W"),)), 0),
        (StreamConfig("S", sources=(SourceConfig("W"),), duplicate_window_ms=7), 7),
    ],
)
def test_the_default_window_is_the_servers(config: StreamConfig, window_ms: int) -> None:
    assert config.window_ms == window_ms


def test_a_stream_with_sources_and_no_window_stores_every_copy() -> None:
    _, js = world()
    js.stream_create(StreamConfig("R", ("r",), sources=(SourceConfig("W"),)))
    assert [js.publish("r", b"", {MSG_ID: "x"}).seq for _ in range(2)] == [1, 2]


def test_expected_headers_are_checked_before_de_duplication() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s.>",)))
    js.publish("s.a", b"", {MSG_ID: "x"})
    with pytest.raises(APIError) as mismatch:
        js.publish("s.a", b"", {MSG_ID: "x", "Nats-Expected-Stream": "T"})
    assert (mismatch.value.code, mismatch.value.err_code) == (400, 10060)
    with pytest.raises(APIError, match="wrong last sequence: 1"):
        js.publish("s.a", b"", {"Nats-Expected-Last-Subject-Sequence": "0"})
    with pytest.raises(APIError, match="wrong last sequence: 1"):
        js.publish("s.b", b"", {"Nats-Expected-Last-Sequence": "0"})
    assert js.publish("s.b", b"", {"Nats-Expected-Last-Subject-Sequence": "0"}).seq == 2


def test_publishing_where_no_stream_listens_finds_no_responders() -> None:
    _, js = world()
    with pytest.raises(NoRespondersError):
        js.publish("nowhere")


def test_overlapping_subjects_and_a_changed_configuration_are_refused() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s.>",)))
    assert js.stream_create(StreamConfig("S", ("s.>",))).state.last_seq == 0
    with pytest.raises(APIError) as changed:
        js.stream_create(StreamConfig("S", ("s.>",), max_msgs=3))
    assert changed.value.err_code == 10058
    with pytest.raises(APIError) as overlap:
        js.stream_create(StreamConfig("T", ("s.a",)))
    assert overlap.value.err_code == 10065


# ---- limits --------------------------------------------------------------------------------


def test_messages_expire_when_their_age_reaches_max_age() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("S", ("s",), max_age_ms=1_000))
    js.publish("s")
    clock.advance(400)
    js.publish("s")
    clock.advance(599)
    assert js.stream_info("S").state.first_seq == 1
    clock.advance(1)
    assert (js.stream_info("S").state.first_seq, js.stream_info("S").state.messages) == (2, 1)
    assert js.next_due_ms() == 1_400
    clock.advance(400)
    state = js.stream_info("S").state
    assert (state.messages, state.first_seq, state.last_seq) == (0, 3, 2)


def test_a_per_subject_limit_removes_the_subjects_oldest_and_acks_it_for_consumers() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s.>",), max_msgs_per_subject=1))
    js.consumer_create("S", ConsumerConfig("c"))
    js.publish("s.a")
    js.publish("s.b")
    assert [d.stream_seq for d in js.fetch("S", "c", 2)] == [1, 2]
    js.publish("s.a")  # removes 1, pending: acked as removed
    info = js.consumer_info("S", "c")
    assert (info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending) == (1, 1, 1)
    assert js.stream_info("S").state.first_seq == 2


# ---- transforms and sourcing ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dest", "subject", "out"),
    [
        ("foo.*.>", "foo.>", "foo.east.a.b", "foo.a.b"),
        ("foo.*.>", "foo.>", "foo.east", None),
        ("a.*.*", "b.$2.{{wildcard(1)}}", "a.x.y", "b.y.x"),
        ("a.*.*", "b.*.*", "a.x.y", "b.x.y"),
        ("_m.east", "_m.east", "_m.east", "_m.east"),
        ("", "", "any.thing", "any.thing"),
    ],
)
def test_transforms(src: str, dest: str, subject: str, out: str | None) -> None:
    assert SubjectTransform(src, dest).apply(subject) == out


@pytest.mark.parametrize(
    ("src", "dest"),
    [("foo.*", "foo.>"), ("a.>", "b.>.c"), ("a.*", "b.$2"), ("a.*", "{{partition(3,1)}}")],
)
def test_transforms_the_simulation_cannot_honour_are_refused(src: str, dest: str) -> None:
    with pytest.raises(ValueError, match="transform"):
        SubjectTransform(src, dest)


def virtual_layout(js: SimJetStream, regions: tuple[str, ...]) -> VirtualStream:
    """The layout of docs/topology.md: a write stream per region, a read stream sourcing all."""
    vs = VirtualStream("V", regions)
    for r in regions:
        js.stream_create(
            StreamConfig(vs.write_stream(r), (f"V.{r}.>", vs.marker_subject(r)), placement=r)
        )
    for r in regions:
        sources = tuple(
            SourceConfig(
                vs.write_stream(x),
                subject_transforms=(
                    SubjectTransform(f"V.{x}.>", "V.>"),
                    SubjectTransform(vs.marker_subject(x), vs.marker_subject(x)),
                ),
            )
            for x in regions
        )
        js.stream_create(
            StreamConfig(vs.read_stream(r), (vs.snapshot_subject(r),), sources=sources, placement=r)
        )
    return vs


def subjects(js: SimJetStream, stream: str) -> list[str]:
    return [m.subject for m in js.stream(stream).matching(1)]


def stored_at(js: SimJetStream, stream: str, seq: int) -> int:
    """When message `seq` of `stream` was stored."""
    return js.msg_get(stream, seq).time_ms


def test_sourcing_renames_keeps_order_and_names_its_origin_as_the_runtime_reads_it() -> None:
    clock, js = world()
    vs = virtual_layout(js, ("east", "west"))
    js.publish("V.east.a.b", b"1", {MSG_ID: "1", "Nats-Expected-Stream": vs.write_stream("east")})
    js.publish(vs.marker_subject("east"), b"m")
    js.publish("V.east.c", b"2")
    clock.advance(1)
    assert subjects(js, vs.read_stream("west")) == ["V.a.b", vs.marker_subject("east"), "V.c"]
    first = js.msg_get(vs.read_stream("west"), 1)
    assert "Nats-Expected-Stream" not in first.headers and first.headers[MSG_ID] == "1"
    assert vs.origin_of(first.headers[SOURCE_HEADER]) == ("east", 1)
    assert first.headers[SOURCE_HEADER].endswith(
        f" V.east.a.b {js.stream('V-write-east').identity}"
    )


def test_a_link_delays_stalls_and_partitions() -> None:
    clock, js = world()
    vs = virtual_layout(js, ("east", "west"))
    east_to_west = (vs.read_stream("west"), vs.write_stream("east"))
    js.set_delay(*east_to_west, 100)
    js.publish("V.east.1")
    clock.advance(99)
    assert subjects(js, vs.read_stream("west")) == []
    assert subjects(js, vs.read_stream("east")) == ["V.1"]  # its own link has no delay
    clock.advance(1)
    assert subjects(js, vs.read_stream("west")) == ["V.1"]
    assert stored_at(js, vs.read_stream("west"), 1) == 100

    js.stall(*east_to_west)
    js.publish("V.east.2")
    clock.advance(1_000)
    assert subjects(js, vs.read_stream("west")) == ["V.1"]
    js.stall(*east_to_west, stalled=False)  # what waited arrives at once
    assert subjects(js, vs.read_stream("west")) == ["V.1", "V.2"]
    assert stored_at(js, vs.read_stream("west"), 2) == 1_100

    js.partition("west")
    js.publish("V.east.3")
    js.publish("V.west.4")
    clock.advance(500)
    assert subjects(js, vs.read_stream("west")) == ["V.1", "V.2", "V.4"]  # within west
    assert subjects(js, vs.read_stream("east")) == ["V.1", "V.2", "V.3"]
    js.partition("west", cut=False)
    clock.advance(100)
    assert subjects(js, vs.read_stream("west")) == ["V.1", "V.2", "V.4", "V.3"]
    assert subjects(js, vs.read_stream("east")) == ["V.1", "V.2", "V.3", "V.4"]


def active(js: SimJetStream, stream: str) -> dict[str, int | None]:
    return {s.name: s.active_ms for s in js.stream_info(stream).sources}


def test_a_stream_tells_when_it_last_heard_from_each_source() -> None:
    clock, js = world()
    vs = virtual_layout(js, ("east", "west"))
    west, east = vs.read_stream("west"), vs.write_stream("east")
    clock.advance(2_500)  # heartbeats every second on an idle link
    assert active(js, west) == {vs.write_stream("east"): 500, vs.write_stream("west"): 500}
    js.publish("V.east.1")
    clock.advance(100)
    assert active(js, west)[east] == 100  # the message arrived at once
    js.partition("west")
    clock.advance(3_000)
    assert active(js, west)[east] == 3_100  # as it was left, growing
    assert js.stream_info(west).leader_since_ms == 0


def test_a_cluster_restarted_elects_new_leaders_and_hears_from_its_sources_late() -> None:
    clock, js = world()
    vs = virtual_layout(js, ("east", "west"))
    east_to_west = (vs.read_stream("west"), vs.write_stream("east"))
    clock.advance(100)  # heard from at the link's opening, at 0
    js.partition("west")
    js.publish("V.east.1")
    clock.advance(5_000)
    js.restart("west", {"east": 3_000, "west": 1_000})
    assert js.stream_info(vs.read_stream("west")).leader_since_ms == 5_100
    assert js.stream_info(vs.read_stream("east")).leader_since_ms == 0  # not restarted
    assert active(js, vs.read_stream("west")) == {
        vs.write_stream("east"): None,
        vs.write_stream("west"): None,
    }
    assert active(js, vs.read_stream("east"))[vs.write_stream("west")] == 5_100
    js.publish("V.west.2")
    clock.advance(2_999)
    assert subjects(js, vs.read_stream("west")) == ["V.2"]  # its own source reconnected
    assert active(js, vs.read_stream("west"))[east_to_west[1]] is None
    clock.advance(1)
    assert subjects(js, vs.read_stream("west")) == ["V.2", "V.1"]
    assert active(js, vs.read_stream("west"))[east_to_west[1]] == 0


def test_pauses_are_told_as_they_take_effect() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s.>",)))
    js.consumer_create("S", ConsumerConfig("d"))
    told: list[tuple[str, str, int | None]] = []
    js.on_paused = lambda stream, name, until: told.append((stream, name, until))
    js.consumer_pause("S", "d", 5_000)
    js.consumer_pause("S", "d", None)
    assert told == [("S", "d", 5_000), ("S", "d", None)]


def test_what_the_origin_removed_before_the_link_took_it_never_arrives() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("W", ("w",), max_msgs=2))
    js.stream_create(StreamConfig("R", ("r",), sources=(SourceConfig("W"),)))
    js.stall("R", "W")
    for _ in range(5):
        js.publish("w")
    js.stall("R", "W", stalled=False)
    clock.advance(1)
    assert [m.headers[SOURCE_HEADER].split(" ")[1] for m in js.stream("R").matching(1)] == [
        "4",
        "5",
    ]


def test_sourced_messages_arrive_in_time_order_and_expire_from_their_arrival() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("A", ("a",)))
    js.stream_create(StreamConfig("B", ("b",)))
    sources = (SourceConfig("A"), SourceConfig("B"))
    js.stream_create(StreamConfig("R", ("r",), max_age_ms=1_000, sources=sources))
    js.set_delay("R", "A", 300)
    js.publish("a")
    clock.advance(100)
    js.publish("b")
    clock.advance(2_000)  # one settle: B's arrives at 100, A's at 300, both expire in turn
    state = js.stream_info("R").state
    assert (state.messages, state.first_seq, state.last_seq) == (0, 3, 2)
    clock2, js2 = world()
    js2.stream_create(StreamConfig("A", ("a",)))
    js2.stream_create(StreamConfig("B", ("b",)))
    js2.stream_create(StreamConfig("R", ("r",), sources=sources))
    js2.set_delay("R", "A", 300)
    js2.publish("a")
    clock2.advance(100)
    js2.publish("b")
    clock2.advance(250)
    assert subjects(js2, "R") == ["b", "a"]
    assert [m.time_ms for m in js2.stream("R").matching(1)] == [100, 300]


def test_a_read_stream_drops_a_copy_from_another_region_within_its_window() -> None:
    clock, js = world()
    for origin in "abc":
        js.stream_create(StreamConfig(origin.upper(), (origin,)))
    sources = tuple(SourceConfig(origin) for origin in "ABC")
    js.stream_create(StreamConfig("R", ("r",), duplicate_window_ms=500, sources=sources))
    js.publish("a", b"", {MSG_ID: "x"})
    clock.advance(499)
    js.publish("b", b"", {MSG_ID: "x"})
    clock.advance(1)
    js.publish("c", b"", {MSG_ID: "x"})
    clock.advance(1)
    assert subjects(js, "R") == ["a", "c"]


def test_a_stream_deleted_and_created_again_is_sourced_anew() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("W", ("w",)))
    js.stream_create(StreamConfig("R", ("r",), sources=(SourceConfig("W"),)))
    js.publish("w", b"old")
    clock.advance(1)
    old_identity = js.stream("W").identity
    js.stream_delete("W")
    with pytest.raises(NotFoundError):
        js.stream_info("W")
    js.stream_create(StreamConfig("W", ("w",)))
    js.publish("w", b"new")
    clock.advance(1)
    sourced = [m.headers[SOURCE_HEADER] for m in js.stream("R").matching(1)]
    assert sourced == [f"W 1 > > w {old_identity}", f"W 1 > > w {js.stream('W').identity}"]
    assert old_identity != js.stream("W").identity


# ---- consumers -------------------------------------------------------------------------------


def test_a_paused_consumer_delivers_nothing_until_its_pause_ends() -> None:
    clock, js = world()
    js.stream_create(StreamConfig("S", ("s",)))
    js.consumer_create("S", ConsumerConfig("c"))
    js.publish("s")
    assert js.consumer_pause("S", "c", 1_000).paused
    assert js.fetch("S", "c", 1) == []
    assert js.next_due_ms() == 1_000
    clock.advance(1_000)
    assert not js.consumer_info("S", "c").paused
    assert [d.stream_seq for d in js.fetch("S", "c", 1)] == [1]


def test_a_consumer_deleted_is_gone_and_its_acks_are_lost_without_a_word() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s",)))
    js.consumer_create("S", ConsumerConfig("c"))
    js.consumer_create("S", ConsumerConfig("d"))
    assert [c.name for c in js.consumer_list("S")] == ["c", "d"]
    js.consumer_delete("S", "c")
    assert [c.name for c in js.consumer_list("S")] == ["d"]
    with pytest.raises(NotFoundError) as gone:
        js.consumer_info("S", "c")
    assert gone.value.err_code == CONSUMER_NOT_FOUND
    js.ack("S", "c", 1)
    with pytest.raises(ServiceUnavailableError) as no_responders:
        js.fetch("S", "c", 1)
    assert no_responders.value.code is None
    with pytest.raises(NotFoundError) as no_stream:
        js.consumer_info("T", "c")
    assert no_stream.value.err_code == STREAM_NOT_FOUND


SUBJECTS = ("s.a", "s.b", "s.c.x")
Step = tuple[str, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(("publish", "fetch", "ack", "purge", "reset", "wait")),
        st.integers(0, 40),
        st.integers(0, 3),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(0, 6), st.sampled_from((0, 50, 300)), st.integers(0, 2))
def test_num_pending_is_what_a_scan_counts_whatever_happens(
    plan: list[Step], max_msgs: int, max_age_ms: int, per_subject: int
) -> None:
    """`num_pending` is kept up to date instead of counted: it must always equal a count of
    the stored messages a consumer delivers from its next sequence on."""
    clock, js = world()
    config = StreamConfig(
        "S",
        ("s.>",),
        max_msgs=max_msgs,
        max_age_ms=max_age_ms and max_age_ms + 100,
        max_msgs_per_subject=per_subject,
    )
    js.stream_create(config)
    filters = {"all": (), "a": ("s.a",), "ac": ("s.a", "s.c.>")}
    for name, subjects in filters.items():
        js.consumer_create("S", ConsumerConfig(name, subjects))
    delivered: dict[str, list[int]] = {name: [] for name in filters}
    for action, n, pick in plan:
        name = list(filters)[pick % len(filters)]
        if action == "publish":
            js.publish(SUBJECTS[n % len(SUBJECTS)])
        elif action == "fetch":
            delivered[name] += [d.stream_seq for d in js.fetch("S", name, 1 + n % 5)]
        elif action == "ack" and delivered[name]:
            js.ack("S", name, delivered[name].pop(n % len(delivered[name])))
        elif action == "purge":
            js.stream_purge("S", n % 8 or None)
        elif action == "reset":
            js.consumer_reset("S", name, n % (js.stream("S").last_seq + 3))
            delivered[name].clear()
        elif action == "wait":
            clock.advance(n * 10)
        stream = js.stream("S")
        for other, subjects in filters.items():
            consumer = stream.consumers[other]
            scanned = sum(1 for _ in stream.matching(consumer.next_seq, subjects))
            assert js.consumer_info("S", other).num_pending == scanned


# ---- key-value -----------------------------------------------------------------------------


def test_a_key_expires_at_its_ttl_and_revisions_go_on() -> None:
    clock, js = world()
    kv = js.kv_bucket_create("b", ttl_ms=1_000)
    assert kv.put("k", b"1") == 1
    clock.advance(500)
    assert kv.delete("j") == 2  # a marker: expires too
    clock.advance(499)
    assert kv.get("k").value == b"1"
    clock.advance(1)
    with pytest.raises(KeyNotFoundError) as expired:
        kv.get("k")
    assert getattr(expired.value, "op", None) is None
    with pytest.raises(KeyNotFoundError) as deleted:
        kv.get("j")
    assert deleted.value.op == "DEL"
    with pytest.raises(KeyWrongLastSequenceError, match="wrong last sequence: 0"):
        kv.update("k", b"2", 1)
    assert kv.create("j", b"again") == 3  # over its marker
    clock.advance(500)
    assert (kv.create("k", b"3"), js.key_value("b").get("j").revision) == (4, 3)
    state = js.stream_info("KV_b").state
    assert (state.messages, state.first_seq, state.last_seq) == (2, 3, 4)
    assert kv.purge("k") == 5
    with pytest.raises(KeyNotFoundError) as purged:
        kv.get("k")
    assert purged.value.op == "PURGE"


# ---- faults --------------------------------------------------------------------------------


def test_injected_faults_raise_the_real_errors_classes() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s",)))
    js.consumer_create("S", ConsumerConfig("c"))
    js.faults.fail_next(Op.CONSUMER_INFO, Fault.ERROR)
    js.faults.fail_next(Op.CONSUMER_INFO, Fault.TIMEOUT)
    js.faults.fail_next(Op.CONSUMER_INFO, Fault.NOT_FOUND)
    js.faults.fail_next(Op.CONSUMER_INFO, Fault.UNAVAILABLE)
    with pytest.raises(APIError) as error:
        js.consumer_info("S", "c")
    assert (error.value.code, error.value.err_code) == (500, 10009)
    with pytest.raises(NatsTimeoutError):
        js.consumer_info("S", "c")
    with pytest.raises(NotFoundError) as missing:
        js.consumer_info("S", "c")
    assert missing.value.err_code == CONSUMER_NOT_FOUND
    with pytest.raises(ServiceUnavailableError) as unavailable:
        js.consumer_info("S", "c")
    assert unavailable.value.err_code == CLUSTER_NOT_AVAILABLE
    assert js.consumer_info("S", "c").name == "c"
    assert js.faults.injected == dict.fromkeys(
        (Fault.ERROR, Fault.TIMEOUT, Fault.NOT_FOUND, Fault.UNAVAILABLE), 1
    ) | {Fault.REPLY_LOST: 0}
    js.faults.fail_next(Op.CONSUMER_RESET, Fault.NOT_FOUND)
    with pytest.raises(NatsTimeoutError):  # nothing answers a reset of a missing consumer
        js.consumer_reset("S", "c", 1)
    js.faults.fail_next(Op.KV_GET, Fault.NOT_FOUND)
    kv = js.kv_bucket_create("b")
    kv.put("k", b"v")
    with pytest.raises(KeyNotFoundError):
        kv.get("k")


def test_a_lost_reply_times_out_after_the_operation_took_effect() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s",)))
    js.faults.fail_next(Op.PUBLISH, Fault.REPLY_LOST, target="S")
    with pytest.raises(SimJSError) as lost:
        js.publish("s", b"", {MSG_ID: "1"})
    assert isinstance(lost.value, NatsTimeoutError)
    retried = js.publish("s", b"", {MSG_ID: "1"})  # the retry finds it stored
    assert (retried.seq, retried.duplicate) == (1, True)


def test_faults_for_one_target_leave_the_others_alone() -> None:
    _, js = world()
    js.stream_create(StreamConfig("S", ("s",)))
    js.stream_create(StreamConfig("T", ("t",)))
    js.faults.fail_next(Op.STREAM_INFO, Fault.ERROR, target="T", times=2)
    assert js.stream_info("S").state.messages == 0
    for _ in range(2):
        with pytest.raises(APIError):
            js.stream_info("T")
    assert js.stream_info("T").state.messages == 0
    js.faults.fail_next(Op.STREAM_INFO, Fault.ERROR)
    js.faults.clear()
    assert js.stream_info("T").state.messages == 0


def test_without_a_meta_leader_only_what_needs_it_fails_and_only_in_that_cluster() -> None:
    _, js = world()
    js.stream_create(StreamConfig("E", ("e",), placement="east"))
    js.stream_create(StreamConfig("W", ("w",), placement="west"))
    js.consumer_create("E", ConsumerConfig("c"))
    js.faults.lose_meta_leader("east")
    assert Op.CONSUMER_CREATE in NEEDS_META and Op.CONSUMER_RESET not in NEEDS_META
    for call in (
        lambda: js.stream_info("E"),
        lambda: js.consumer_create("E", ConsumerConfig("d")),
        lambda: js.consumer_pause("E", "c", 10),
        lambda: js.msg_get("E", 1),
    ):
        with pytest.raises(ServiceUnavailableError):
            call()
    js.publish("e")
    assert [d.stream_seq for d in js.fetch("E", "c", 1)] == [1]
    js.ack("E", "c", 1)
    assert js.consumer_reset("E", "c", 1).ack_floor.stream_seq == 0
    assert js.consumer_info("E", "c").num_pending == 1
    js.consumer_create("W", ConsumerConfig("d"))
    js.faults.restore_meta_leader("east")
    assert js.stream_info("E").state.messages == 1


def run_with_random_faults(seed: int) -> list[str]:
    clock, js = world(seed=seed)
    js.stream_create(StreamConfig("S", ("s",)))
    js.consumer_create("S", ConsumerConfig("c"))
    js.faults.fail_randomly(0.3, (Fault.ERROR, Fault.TIMEOUT, Fault.REPLY_LOST))
    outcomes = []
    for i in range(60):
        clock.advance(10)
        try:
            if i % 2:
                outcomes.append(f"pub {js.publish('s', b'%d' % i).seq}")
            else:
                outcomes.append(f"got {[d.stream_seq for d in js.fetch('S', 'c', 2)]}")
        except SimJSError as err:
            outcomes.append(type(err).__name__)
    return outcomes


def test_random_faults_come_from_the_given_random_and_only_from_it() -> None:
    first = run_with_random_faults(7)
    assert first == run_with_random_faults(7)
    assert first != run_with_random_faults(8)
    assert {"SimServerError", "SimTimeout"} <= set(first)


def test_random_faults_need_a_random() -> None:
    with pytest.raises(ValueError, match=r"random\.Random"):
        SimJetStream(ManualClock()).faults.fail_randomly(0.5, (Fault.ERROR,))
    with pytest.raises(ValueError, match="probability"):
        world()[1].faults.fail_randomly(0.0, (Fault.ERROR,))
