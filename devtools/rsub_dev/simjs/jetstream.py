"""`SimJetStream`: one JetStream account over a simulated super-cluster, on virtual time.

Every operation first brings the model up to the clock's time (`settle`: sourced messages
arrive in the order of their arrival times, and limits by age apply as of each arrival),
then consults the `Faults` (which may fail it, or lose its reply after doing it), then
runs. Operations are synchronous and take effect at once: an asynchronous port over this
model decides when its callers see them.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from rsub_dev.simjs.clock import Clock
from rsub_dev.simjs.consumer import Consumer, ConsumerConfig, ConsumerInfo, Delivery
from rsub_dev.simjs.errors import (
    CONSUMER_ALREADY_EXISTS,
    STREAM_NAME_EXISTS,
    SUBJECT_OVERLAP,
    SimBucketNotFound,
    SimJSError,
    SimNoResponders,
    SimTimeout,
    SimUnavailable,
    api_error,
    consumer_not_found,
    no_message_found,
    stream_not_found,
)
from rsub_dev.simjs.faults import Fault, Faults, Op
from rsub_dev.simjs.kv import KeyValue, bucket_config, bucket_stream
from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.sourcing import Link
from rsub_dev.simjs.stream import (
    PubAck,
    SourceConfig,
    SourceInfo,
    Stream,
    StreamConfig,
    StreamInfo,
)
from rsub_dev.simjs.subjects import SubjectIndex
from sidecar.nats.topology import subjects_overlap

T = TypeVar("T")


class SimJetStream:
    def __init__(
        self, clock: Clock, *, rng: random.Random | None = None, faults: Faults | None = None
    ) -> None:
        """`rng` feeds the random faults (`faults.fail_randomly`); nothing else draws."""
        self.clock = clock
        self.faults = faults if faults is not None else Faults(rng)
        self._streams: dict[str, Stream] = {}
        self._links: list[Link] = []
        # What keeps every operation's cost independent of the number of streams: the
        # streams by the literal tokens of their subjects (`_candidates`), the links from and to
        # each stream, the links that may have a message to carry (by their place in
        # `_links`), the streams with a limit by age, and the consumers ever paused.
        self._by_subject = SubjectIndex()
        self._serial: dict[str, int] = {}
        self._links_from: dict[str, list[Link]] = {}
        self._links_to: dict[str, list[Link]] = {}
        self._pending: dict[int, Link] = {}
        self._due: list[tuple[int, int]] = []
        """(at least when its next message arrives, place) of the pending links: a heap."""
        self._aging: list[Stream] = []
        self._links_made = 0
        self._paused: set[tuple[str, str]] = set()
        self._cut: set[str | None] = set()
        self._settled_ms = clock.now_ms()
        self._created = 0  # streams created so far (in their creation times' nanoseconds)
        self._leader_since: dict[str, int] = {}  # per stream, when its leader was elected
        self.on_sourced: Callable[[Link, StoredMessage, PubAck], None] | None = None
        """Told of every message a link carries: the origin's, and where the target stored it
        (or the stored copy it was dropped for, `duplicate`)."""
        self.on_paused: Callable[[str, str, int | None], None] | None = None
        """Told of every `CONSUMER.PAUSE` that takes effect: stream, consumer, until when
        (None: resumed)."""
        self.on_stored: Callable[[str], None] | None = None
        """Told of every message a stream stores (published, sourced or a key's value): the
        stream's name."""

    @property
    def now_ms(self) -> int:
        """The time the model stands at (the clock's at the last `settle`)."""
        return self._settled_ms

    # ---- time -----------------------------------------------------------------------------

    def settle(self) -> None:
        """Bring sourcing and limits by age up to the clock's time."""
        now = self.clock.now_ms()
        if now < self._settled_ms:
            raise RuntimeError(f"the clock went back from {self._settled_ms} to {now} ms")
        while (arrival := self._next_arrival()) is not None and arrival[0] <= now:
            at, link, _ = arrival
            for stream in self._aging:
                stream.expire(at)
            msg = link.next_message(self._streams[link.origin])  # unless it expired at `at`
            if msg is not None and link.arrival_ms(msg) == at:
                ack = link.carry(msg, self._streams[link.origin], self._streams[link.target], at)
                if self.on_sourced is not None:
                    self.on_sourced(link, msg, ack)
        for stream in self._aging:
            stream.expire(now)
        self._settled_ms = now

    def next_due_ms(self) -> int | None:
        """When something next happens by itself: an arrival, an expiry, a pause ending."""
        self.settle()
        now = self._settled_ms
        times = [t for s in self._aging if (t := s.next_expiry_ms()) is not None]
        for stream_name, name in list(self._paused):
            stream = self._streams.get(stream_name)
            consumer = stream.consumers.get(name) if stream is not None else None
            until = consumer.pause_until_ms if consumer is not None else None
            if until is None or until <= now:
                self._paused.discard((stream_name, name))
            else:
                times.append(until)
        if (arrival := self._next_arrival()) is not None:
            times.append(arrival[0])
        return min(times, default=None)

    def _next_arrival(self) -> tuple[int, Link, StoredMessage] | None:
        """The first arrival due over the links (the first of them in `_links` on a tie).

        Only the pending links can have one, each in `_due` under a time at or before its
        next arrival: the first entry whose time is its link's arrival is the first arrival
        (one found later is moved down to it; a blocked link leaves the heap until `_rewire`
        puts every pending link back)."""
        due = self._due
        while due:
            at, place = due[0]
            link = self._pending.get(place)
            origin = self._streams.get(link.origin) if link is not None else None
            if link is None or origin is None:
                heapq.heappop(due)
                self._pending.pop(place, None)
                continue
            if self._blocked(link):
                heapq.heappop(due)
                continue
            msg = link.next_message(origin)
            if msg is None:
                heapq.heappop(due)
                del self._pending[place]
                continue
            arrival = link.arrival_ms(msg)
            if arrival != at:
                heapq.heapreplace(due, (arrival, place))
                continue
            return arrival, link, msg
        return None

    def _pend(self, link: Link) -> None:
        """`link` may have a message to carry, arriving at the time the model stands at or
        later."""
        self._pending[link.place] = link
        heapq.heappush(self._due, (self._settled_ms, link.place))

    def _repend(self) -> None:
        """Every pending link back in `_due` (after a change that may bring an arrival
        forward: a link unblocked, a delay shortened, a link sourcing anew)."""
        self._due = [(0, place) for place in sorted(self._pending)]

    def _candidates(self, subject: str) -> list[Stream]:
        """The streams whose subjects may overlap `subject`, in creation order."""
        names = self._by_subject.candidates(subject)
        return sorted((self._streams[n] for n in names), key=lambda s: self._serial[s.name])

    def _overlapping(self, subjects: tuple[str, ...], but: Stream | None = None) -> bool:
        return any(
            other is not but and any(subjects_overlap(subject, b) for b in other.config.subjects)
            for subject in subjects
            for other in self._candidates(subject)
        )

    def _index(self, stream: Stream, add: bool) -> None:
        """Add `stream` to the subject and age indexes (or take it out)."""
        for subject in stream.config.subjects:
            if add:
                self._by_subject.add(stream.name, subject)
            else:
                self._by_subject.remove(stream.name, subject)
        if add and stream.config.max_age_ms:
            self._aging.append(stream)
        elif not add and stream in self._aging:
            self._aging.remove(stream)

    def _add_link(self, link: Link) -> None:
        self._links.append(link)
        self._links_from.setdefault(link.origin, []).append(link)
        self._links_to.setdefault(link.target, []).append(link)
        self._pend(link)

    def _relink(self, links: list[Link]) -> None:
        """`links` (a subset of `_links`, in order) are the links now."""
        self._links = links
        self._links_from, self._links_to = {}, {}
        for link in links:
            self._links_from.setdefault(link.origin, []).append(link)
            self._links_to.setdefault(link.target, []).append(link)
        alive = {id(link) for link in links}
        self._pending = {p: link for p, link in self._pending.items() if id(link) in alive}
        self._repend()

    # ---- the network ------------------------------------------------------------------------

    def link(self, target: str, origin: str) -> Link:
        """The link sourcing `origin` into `target` (set `delay_ms` through `set_delay`)."""
        for link in self._links_to.get(target, ()):
            if link.target == target and link.origin == origin:
                return link
        raise KeyError(f"{target} does not source {origin}")

    def set_delay(self, target: str, origin: str, delay_ms: int) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must not be negative, got {delay_ms}")
        self.settle()
        self.link(target, origin).delay_ms = delay_ms
        self._repend()

    def stall(self, target: str, origin: str, stalled: bool = True) -> None:
        """Stop (or restart) the sourcing of `origin` into `target`."""
        self._rewire(lambda: setattr(self.link(target, origin), "stalled", stalled))

    def partition(self, cluster: str | None, cut: bool = True) -> None:
        """Cut `cluster` from every other one (or heal it): sourcing across stops."""
        self._rewire(lambda: (self._cut.add if cut else self._cut.discard)(cluster))

    def restart(self, cluster: str, reconnect_ms: Mapping[str, int]) -> None:
        """The servers of `cluster` come back (after a loss: `partition` healed) with what
        they stored: its streams elect new leaders (`leader_since`), and each link between
        it and a cluster `c` (itself included: its streams' sources of its own streams)
        carries nothing for `reconnect_ms[c]` (0 when not named); meanwhile its streams have
        not heard from those sources (`active` of -1)."""
        self.partition(cluster, cut=False)
        now = self._settled_ms
        for name, stream in self._streams.items():
            if stream.config.placement == cluster:
                self._leader_since[name] = now
        for link in self._links:
            origin = self._streams.get(link.origin)
            here = self._streams[link.target].config.placement
            there = origin.config.placement if origin is not None else None
            if cluster not in (here, there):
                continue
            other = there if here == cluster else here
            link.open_since_ms = max(link.open_since_ms, now + reconnect_ms.get(other or "", 0))
            if here == cluster:
                link.heard_ms = None

    def _new_link(self, target: str, source: SourceConfig) -> Link:
        self._links_made += 1
        return Link(target, source, open_since_ms=self._settled_ms, place=self._links_made)

    def _rewire(self, change: Callable[[], object]) -> None:
        self.settle()
        now = self._settled_ms
        was = {id(link): (self._blocked(link), self._active(link)) for link in self._links}
        change()
        for link in self._links:
            blocked, active = was[id(link)]
            if blocked and not self._blocked(link):
                link.open_since_ms = max(link.open_since_ms, now)
            elif not blocked and self._blocked(link):
                link.heard_ms = None if active is None else now - active
        self._repend()

    def _active(self, link: Link) -> int | None:
        """Nothing is heard from an origin that does not exist (-1 on a real server)."""
        blocked = self._blocked(link) or link.origin not in self._streams
        return link.active_ms(self._settled_ms, blocked)

    def _blocked(self, link: Link) -> bool:
        if link.stalled:
            return True
        if not self._cut:
            return False
        origin, target = self._streams.get(link.origin), self._streams[link.target]
        here, there = target.config.placement, origin.config.placement if origin else None
        return here != there and (here in self._cut or there in self._cut)

    # ---- operations --------------------------------------------------------------------------

    def _call(
        self,
        op: Op,
        target: str,
        action: Callable[[], T],
        missing: Callable[[], SimJSError] = stream_not_found,
        cluster: str | None = None,
    ) -> T:
        """Run `action` as operation `op` on `target` (a stream, or a bucket: placed in the
        cluster of the stream of that name unless `cluster` says), with faults."""
        self.settle()
        stream = self._streams.get(target)
        if stream is not None:
            cluster = stream.config.placement
        fault = self.faults.check(op, target, cluster)
        if fault is Fault.NOT_FOUND:
            raise missing()
        result = action()
        if fault is Fault.REPLY_LOST:
            raise SimTimeout()
        return result

    def _stored(self, stream: Stream) -> None:
        for link in self._links_from.get(stream.name, ()):
            self._pend(link)
        if self.on_stored is not None:
            self.on_stored(stream.name)

    def _stream(self, name: str) -> Stream:
        stream = self._streams.get(name)
        if stream is None:
            raise stream_not_found()
        return stream

    def stream(self, name: str) -> Stream:
        """The stream itself, to read (no faults, no time passing): tails and checks."""
        self.settle()
        return self._stream(name)

    # ---- streams ------------------------------------------------------------------------------

    def stream_create(self, config: StreamConfig) -> StreamInfo:
        """Create a stream (again with the same configuration: nothing changes)."""

        def create() -> StreamInfo:
            existing = self._streams.get(config.name)
            if existing is not None:
                if existing.config != config:
                    raise api_error(
                        400,
                        STREAM_NAME_EXISTS,
                        "stream name already in use with a different configuration",
                    )
                return self._info(existing)
            if self._overlapping(config.subjects):
                raise api_error(400, SUBJECT_OVERLAP, "subjects overlap with an existing stream")
            self._created += 1
            stream = Stream(config, self._settled_ms * 1_000_000 + self._created % 1_000_000)
            stream.watcher = self._stored
            self._streams[config.name] = stream
            self._serial[config.name] = self._created
            self._index(stream, add=True)
            self._leader_since[config.name] = self._settled_ms
            for source in config.sources:
                self._add_link(self._new_link(config.name, source))
            return self._info(stream)

        return self._call(Op.STREAM_CREATE, config.name, create, cluster=config.placement)

    def stream_update(self, config: StreamConfig) -> StreamInfo:
        """Change an existing stream's configuration: its subjects, limits and sources (a
        source added is sourced from its origin's start, one removed stops)."""

        def update() -> StreamInfo:
            stream = self._stream(config.name)
            if self._overlapping(config.subjects, but=stream):
                raise api_error(400, SUBJECT_OVERLAP, "subjects overlap with an existing stream")
            kept = [s for s in stream.config.sources if s in config.sources]
            self._relink(
                [link for link in self._links if link.target != stream.name or link.source in kept]
            )
            for source in config.sources:
                if source not in kept:
                    self._add_link(self._new_link(stream.name, source))
            self._index(stream, add=False)
            stream.config = config
            self._index(stream, add=True)
            return self._info(stream)

        return self._call(Op.STREAM_UPDATE, config.name, update)

    def stream_names(self, subject: str | None = None, cluster: str | None = None) -> list[str]:
        """The streams' names, in creation order (with `subject`: those whose subjects
        overlap it), asked from `cluster` (None: unaffected by a lost meta leader)."""

        def names() -> list[str]:
            if subject is None:
                return list(self._streams)
            return [
                stream.name
                for stream in self._candidates(subject)
                if any(subjects_overlap(subject, s) for s in stream.config.subjects)
            ]

        return self._call(Op.STREAM_NAMES, "", names, cluster=cluster)

    def stream_delete(self, name: str) -> None:
        def delete() -> None:
            self._index(self._streams.pop(self._stream(name).name), add=False)
            self._relink([link for link in self._links if link.target != name])
            for link in self._links_from.get(name, ()):
                link.restart()  # a stream created again under the name is sourced anew

        self._call(Op.STREAM_DELETE, name, delete)

    def stream_info(self, name: str) -> StreamInfo:
        """Its configuration and state, its sources (when it last heard from each) and when
        its leader was elected."""

        return self._call(Op.STREAM_INFO, name, lambda: self._info(self._stream(name)))

    def _info(self, stream: Stream) -> StreamInfo:
        sources = tuple(
            SourceInfo(link.origin, self._active(link))
            for link in self._links_to.get(stream.name, ())
        )
        leader_since = self._leader_since.get(stream.name)
        return replace(stream.info(), sources=sources, leader_since_ms=leader_since)

    def stream_purge(self, name: str, keep: int | None = None) -> int:
        """Purge `name` (all of it, or all but its last `keep` messages); how many went."""
        return self._call(Op.STREAM_PURGE, name, lambda: self._stream(name).purge(keep))

    def publish(
        self, subject: str, data: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> PubAck:
        """Store a message in the stream whose subjects take `subject`."""
        stream = next((s for s in self._candidates(subject) if s.takes(subject)), None)

        def store() -> PubAck:
            if stream is None:
                raise SimNoResponders()
            return stream.store(subject, data, dict(headers or {}), self._settled_ms)

        name = stream.name if stream is not None else subject
        return self._call(Op.PUBLISH, name, store, missing=SimNoResponders)

    def msg_get(self, stream: str, seq: int, next_by_subj: str | None = None) -> StoredMessage:
        """`STREAM.MSG.GET`: the message at `seq` (with `next_by_subj`: the first at or after
        `seq` on that subject); "no message found" when there is none."""

        def get() -> StoredMessage:
            msg = self._stream(stream).get(seq, next_by_subj)
            if msg is None:
                raise no_message_found()
            return msg

        return self._call(Op.MSG_GET, stream, get)

    # ---- consumers ----------------------------------------------------------------------------

    def _consumer_call(
        self,
        op: Op,
        stream: str,
        name: str,
        action: Callable[[Consumer], T],
        missing: Callable[[], SimJSError] = consumer_not_found,
    ) -> T:
        def run() -> T:
            consumers = self._stream(stream).consumers
            if name not in consumers:
                raise missing()
            return action(consumers[name])

        return self._call(op, stream, run, missing)

    def consumer_create(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        """Create a durable (again with the same configuration: nothing changes; with another
        one: "consumer already exists")."""

        def create() -> ConsumerInfo:
            owner = self._stream(stream)
            existing = owner.consumers.get(config.durable_name)
            if existing is not None and existing.config != config:
                raise api_error(400, CONSUMER_ALREADY_EXISTS, "consumer already exists")
            if existing is None:
                existing = owner.consumers[config.durable_name] = Consumer(owner, config)
            return existing.info(self._settled_ms)

        return self._call(Op.CONSUMER_CREATE, stream, create)

    def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return self._consumer_call(
            Op.CONSUMER_INFO, stream, name, lambda c: c.info(self._settled_ms)
        )

    def consumer_list(self, stream: str) -> list[ConsumerInfo]:
        def listing() -> list[ConsumerInfo]:
            consumers = self._stream(stream).consumers.values()
            return [c.info(self._settled_ms) for c in consumers]

        return self._call(Op.CONSUMER_LIST, stream, listing)

    def consumer_delete(self, stream: str, name: str) -> None:
        self._consumer_call(
            Op.CONSUMER_DELETE, stream, name, lambda c: self._stream(stream).consumers.pop(name)
        )

    def consumer_pause(self, stream: str, name: str, until_ms: int | None) -> ConsumerInfo:
        """`CONSUMER.PAUSE`: deliver nothing before `until_ms` (None: resume now)."""

        def pause(consumer: Consumer) -> ConsumerInfo:
            consumer.pause_until_ms = until_ms
            if until_ms is not None:
                self._paused.add((stream, name))
            if self.on_paused is not None:
                self.on_paused(stream, name, until_ms)
            return consumer.info(self._settled_ms)

        return self._consumer_call(Op.CONSUMER_PAUSE, stream, name, pause)

    def consumer_reset(self, stream: str, name: str, seq: int = 0) -> ConsumerInfo:
        """`CONSUMER.RESET` (see `Consumer.reset`); the reply's info (its ack floor is the
        sequence it starts at, less one). Nothing answers for a consumer that does not exist:
        the request times out, as on the real server."""

        def reset(consumer: Consumer) -> ConsumerInfo:
            consumer.reset(seq)
            return consumer.info(self._settled_ms)

        return self._consumer_call(Op.CONSUMER_RESET, stream, name, reset, missing=SimTimeout)

    def fetch(self, stream: str, name: str, batch: int) -> list[Delivery]:
        """Pull up to `batch` messages at once (none: an empty list). A pull from a consumer
        that does not exist gets the bare 503 status of no responders."""
        return self._consumer_call(
            Op.FETCH, stream, name, lambda c: c.fetch(batch, self._settled_ms), SimUnavailable
        )

    def ack(self, stream: str, name: str, stream_seq: int) -> None:
        """Ack a delivered message. An ack for a consumer that does not exist is lost without
        a word (an ack waiting for its reply, as `Fault.NOT_FOUND` has it, times out)."""

        def ack() -> None:
            owner = self._streams.get(stream)
            consumer = owner.consumers.get(name) if owner is not None else None
            if consumer is not None:
                consumer.ack(stream_seq)

        self._call(Op.ACK, stream, ack, missing=SimTimeout)

    # ---- key-value buckets ------------------------------------------------------------------

    def kv_bucket_create(
        self, bucket: str, ttl_ms: int = 0, placement: str | None = None
    ) -> KeyValue:
        """Create a bucket (history 1; values expire `ttl_ms` after they were written): the
        stream `KV_<bucket>`, created as any stream (`Op.STREAM_CREATE`)."""
        self.stream_create(bucket_config(bucket, ttl_ms, placement))
        return KeyValue(self, bucket)

    def key_value(self, bucket: str) -> KeyValue:
        """Bind to an existing bucket."""
        if bucket_stream(bucket) not in self._streams:
            raise SimBucketNotFound()
        return KeyValue(self, bucket)
