"""A durable pull consumer with explicit acks, as nats-server 2.15.1 keeps one.

The server keeps a consumer's state twice, and the difference shows in what it reports:

- its running state: the next stream sequence to look at (`o.sseq`), the next delivery
  sequence, the messages delivered and not acked (pending), and ack floors;
- its store, which `CONSUMER.INFO` reports the delivered and ack floor sequences from. The
  store moves its ack floor on every ack by its own rule, and takes the running state whole
  only after a purge, and then only if that is not older than what it holds (an ack floor
  below its own is refused: after a purge that removed pending messages the two disagree).

Both are modelled (`server/consumer.go` `processAckMsg`, `moveAckFloor`, `purge`,
`resetStartingSeq`, `getNextMsg`; `server/filestore.go` `consumerFileStore.UpdateDelivered`,
`UpdateAcks`, `Update`), and checked against a real server by
tests/dev/test_simjs_conformance.py. Removal by limits (`max_msgs`, `max_age`, per-subject)
acks a pending message (`decStreamPending` terminates it), so the floor moves over removed
messages at the head of the pending; a consumer with none pending stays where it is (the
server's minute-long drift check, `checkAckFloor`, is not modelled). A purge moves every
consumer to the new first sequence, idle ones too. A pull that finds nothing more it
delivers moves the next sequence to look at past the stream's end (what a filtered
consumer skips). Not modelled: redelivery (`ack_wait` never expires), naks, push
consumers, ack policies other than explicit, max ack pending.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from rsub_dev.simjs.errors import INVALID_RESET, api_error
from rsub_dev.simjs.message import StoredMessage
from sidecar.nats.topology import subject_within


class Stream(Protocol):
    """What a consumer reads of its stream (`rsub_dev.simjs.stream.Stream`)."""

    @property
    def name(self) -> str: ...

    @property
    def first_seq(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    def matching(
        self, start: int, filters: tuple[str, ...] = (), last: int | None = None
    ) -> Iterator[StoredMessage]: ...


DeliverPolicy = Literal["all", "by_start_sequence"]


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A durable pull consumer's configuration (explicit acks)."""

    durable_name: str
    filter_subjects: tuple[str, ...] = ()
    deliver_policy: DeliverPolicy = "all"
    opt_start_seq: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.deliver_policy == "by_start_sequence") != (self.opt_start_seq > 0):
            raise ValueError(
                f"consumer {self.durable_name}: opt_start_seq goes with by_start_sequence, "
                f"got {self.deliver_policy} and {self.opt_start_seq}"
            )


@dataclass(frozen=True, slots=True)
class SequencePair:
    consumer_seq: int
    stream_seq: int


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    stream: str
    name: str
    config: ConsumerConfig
    delivered: SequencePair
    ack_floor: SequencePair
    num_pending: int
    num_ack_pending: int
    paused: bool
    # How long the pause has left: timing, not state (left out of comparisons).
    pause_remaining_ms: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message a fetch delivered; `num_pending` is what remained after it."""

    stream_seq: int
    consumer_seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]
    num_pending: int


@dataclass(slots=True)
class _Stored:
    """The consumer's store: what `CONSUMER.INFO` reports."""

    delivered: SequencePair
    ack_floor: SequencePair
    pending: dict[int, int]  # stream seq -> delivery seq


class Consumer:
    def __init__(self, stream: Stream, config: ConsumerConfig) -> None:
        self.stream = stream
        self.config = config
        self.pause_until_ms: int | None = None
        first = max(stream.first_seq, 1)
        start = first if config.deliver_policy == "all" else max(config.opt_start_seq, first)
        self._sseq = start  # the next stream sequence to look at
        self._dseq = 1  # the next delivery sequence
        self._adflr, self._asflr = 0, start - 1
        self._pending: dict[int, int] = {}  # stream seq -> delivery seq, ascending
        self._store = _Stored(SequencePair(0, start - 1), SequencePair(0, start - 1), {})
        self._counted: tuple[int, int, int] | None = None
        """(a, b, n): n messages it delivers are stored in [a, b] (`num_pending`, kept up to
        date as the stream removes messages, so a consumer far behind costs no scan)."""

    @property
    def name(self) -> str:
        return self.config.durable_name

    @property
    def next_seq(self) -> int:
        """The next stream sequence it looks at (the server's running `sseq`)."""
        return self._sseq

    def paused(self, now_ms: int) -> bool:
        return self.pause_until_ms is not None and now_ms < self.pause_until_ms

    def info(self, now_ms: int) -> ConsumerInfo:
        return ConsumerInfo(
            stream=self.stream.name,
            name=self.name,
            config=self.config,
            delivered=self._store.delivered,
            ack_floor=self._store.ack_floor,
            num_pending=self.num_pending(),
            num_ack_pending=len(self._pending),
            paused=self.paused(now_ms),
            pause_remaining_ms=(
                self.pause_until_ms - now_ms
                if self.pause_until_ms is not None and self.paused(now_ms)
                else 0
            ),
        )

    def num_pending(self) -> int:
        """The stored messages from the next one to look at on that it delivers."""
        last = self.stream.last_seq
        if self._counted is None or self._sseq < self._counted[0]:
            count = self._count(self._sseq, last)
        else:
            a, b, n = self._counted
            gone = self._count(a, min(self._sseq - 1, b))
            count = n - gone + self._count(max(b + 1, self._sseq), last)
        self._counted = (self._sseq, last, count)
        return count

    def _count(self, first: int, last: int) -> int:
        return sum(1 for _ in self.stream.matching(first, self.config.filter_subjects, last))

    def fetch(self, batch: int, now_ms: int) -> list[Delivery]:
        """Up to `batch` messages, at once (a paused consumer delivers none)."""
        if batch < 1:
            raise ValueError(f"batch must be positive, got {batch}")
        if self.paused(now_ms):
            return []
        out: list[Delivery] = []
        for msg in self.stream.matching(self._sseq, self.config.filter_subjects):
            if len(out) == batch:
                break
            dseq = self._dseq
            self._pending[msg.seq] = dseq
            self._store_delivered(dseq, msg.seq)
            self._dseq, self._sseq = dseq + 1, msg.seq + 1
            out.append(Delivery(msg.seq, dseq, msg.subject, msg.data, msg.headers, 0))
        else:
            # The pull ran out of messages: the server moves past what it looked at.
            self._sseq = max(self._sseq, self.stream.last_seq + 1)
        after = self.num_pending()
        return [replace(d, num_pending=after + len(out) - 1 - k) for k, d in enumerate(out)]

    def ack(self, stream_seq: int) -> None:
        """Ack a delivered message (an ack of anything else is ignored, as on the server)."""
        if stream_seq >= self._sseq:
            return
        dseq = self._pending.pop(stream_seq, None)
        if dseq is None:
            return
        if not self._pending:
            self._adflr, self._asflr = self._dseq - 1, self._sseq - 1
        elif dseq == self._adflr + 1:
            self._adflr, self._asflr = dseq, stream_seq
            following = next((s for s in self._pending if s > stream_seq), None)
            if following is not None:
                self._adflr, self._asflr = self._pending[following] - 1, following - 1
        self._store_acked(dseq, stream_seq)

    def removed(self, msg: StoredMessage) -> None:
        """The stream removed `msg` by a limit: a pending one is acked (terminated)."""
        if self._counted is not None:
            a, b, n = self._counted
            if a <= msg.seq <= b and self._delivers(msg.subject):
                self._counted = (a, b, n - 1)
        if msg.seq in self._pending:
            self.ack(msg.seq)

    def _delivers(self, subject: str) -> bool:
        filters = self.config.filter_subjects
        return not filters or any(subject_within(subject, f) for f in filters)

    def purged(self, first_seq: int) -> None:
        """The stream was purged up to `first_seq` (its first sequence now)."""
        self._counted = None
        self._sseq = max(self._sseq, first_seq)
        if self._asflr < first_seq:
            self._asflr = first_seq - 1
            for seq in [s for s in self._pending if s <= self._asflr]:
                dseq = self._pending.pop(seq)
                if dseq > self._adflr:
                    self._adflr = dseq
                    self._dseq = max(self._dseq, self._adflr)
                self._store_acked(dseq, seq)
        if not self._pending:
            self._adflr, self._asflr = self._dseq - 1, self._sseq - 1
        self._store_running_state()

    def reset(self, seq: int) -> int:
        """`$JS.API.CONSUMER.RESET` (nats-server 2.14+): deliver from `seq` again (0: from the
        ack floor), everything pending forgotten, delivery sequences from 1. A consumer that
        delivers by start sequence cannot go below it. Returns the sequence it starts at."""
        if seq < 0:
            raise ValueError(f"reset sequence must not be negative, got {seq}")
        if seq == 0:
            seq = self._asflr + 1
        elif self.config.deliver_policy == "by_start_sequence" and seq < self.config.opt_start_seq:
            raise api_error(400, INVALID_RESET, "invalid reset: below start seq")
        self._pending.clear()
        self._sseq, self._dseq = seq, 1
        self._adflr, self._asflr = 0, seq - 1
        self._store = _Stored(SequencePair(0, seq - 1), SequencePair(0, seq - 1), {})
        return seq

    # ---- the store ----------------------------------------------------------------------

    def _store_delivered(self, dseq: int, sseq: int) -> None:
        store = self._store
        if dseq <= store.ack_floor.consumer_seq:
            return
        if sseq > store.delivered.stream_seq:
            store.pending[sseq] = dseq
        store.delivered = SequencePair(
            max(store.delivered.consumer_seq, dseq), max(store.delivered.stream_seq, sseq)
        )

    def _store_acked(self, dseq: int, sseq: int) -> None:
        store = self._store
        if dseq <= store.ack_floor.consumer_seq or sseq not in store.pending:
            return
        dseq = min(dseq, store.pending.pop(sseq))
        if not store.pending:
            store.ack_floor = store.delivered
        elif dseq == store.ack_floor.consumer_seq + 1:
            store.ack_floor = SequencePair(dseq, sseq)
            if store.delivered.consumer_seq > dseq:
                following = min(
                    (s for s in store.pending if sseq < s <= store.delivered.stream_seq),
                    default=None,
                )
                if following is not None:
                    store.ack_floor = SequencePair(store.pending[following] - 1, following - 1)

    def _store_running_state(self) -> None:
        """The store takes the running state unless it is inconsistent or older than its own."""
        store = self._store
        delivered = SequencePair(self._dseq - 1, self._sseq - 1)
        floor = SequencePair(self._adflr, self._asflr)
        if (
            floor.consumer_seq > delivered.consumer_seq
            or floor.stream_seq > delivered.stream_seq
            or any(not floor.stream_seq < s <= delivered.stream_seq for s in self._pending)
            or delivered.consumer_seq < store.delivered.consumer_seq
            or floor.stream_seq < store.ack_floor.stream_seq
        ):
            return
        self._store = _Stored(delivered, floor, dict(self._pending))
