"""A stream: messages by sequence, limits, purges, de-duplication, expected-header checks.

Sequences start at 1 and never repeat. `first_seq` is the first message still stored (the
last sequence + 1 when none is, 0 for a stream that never stored one). Limits remove from the
front (`max_msgs`, `max_age_ms`, evaluated against the virtual clock) or the oldest message of
a subject (`max_msgs_per_subject`), and tell the consumers (a pending message removed counts
as acked); a purge removes the front and moves every consumer to the new first sequence.
Publishing checks, in the server's order, `Nats-Expected-Stream`,
`Nats-Expected-Last-Subject-Sequence`, `Nats-Expected-Last-Sequence`, then drops a message
whose `Nats-Msg-Id` the stream stored less than `duplicate_window_ms` ago (answering with
the stored copy's sequence, `duplicate`). The default window is the server's: 2 min (at most
`max_age_ms`) for a stream without sources, none for one with sources. Only discard-old limits
are modelled, and no byte limits.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from nats.js.api import Header

from rsub_dev.simjs.clock import rfc3339_nano
from rsub_dev.simjs.consumer import Consumer
from rsub_dev.simjs.errors import (
    STREAM_NOT_MATCH,
    api_error,
    wrong_last_sequence,
)
from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.subjects import SubjectTransform
from sidecar.nats.topology import subject_within

DEFAULT_DUPLICATE_WINDOW_MS = 120_000
_HASH_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def stream_identity(created: str) -> str:
    """The identity a stream's sourced messages name it by (the last field of their
    `Nats-Stream-Source`): the server's 8-character hash of its creation time as it reports
    it (`created`, RFC 3339 with nanoseconds, UTC). A stream created again gets a new one."""
    digest = hashlib.sha256(created.encode()).digest()
    return "".join(_HASH_DIGITS[b % len(_HASH_DIGITS)] for b in digest[:8])


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """One source of a stream: another stream, optionally filtered (`filter_subject`) or
    transformed (`subject_transforms`: a message is sourced when it matches one of their
    sources, renamed by the first that matches)."""

    name: str
    filter_subject: str | None = None
    subject_transforms: tuple[SubjectTransform, ...] = ()

    def __post_init__(self) -> None:
        if self.filter_subject is not None and self.subject_transforms:
            raise ValueError(f"source {self.name}: a filter or transforms, not both")

    def subject_for(self, subject: str) -> str | None:
        """The subject a message of the origin on `subject` is stored under, or None when
        this source does not take it."""
        if self.subject_transforms:
            for transform in self.subject_transforms:
                renamed = transform.apply(subject)
                if renamed is not None:
                    return renamed
            return None
        if self.filter_subject is not None and not subject_within(subject, self.filter_subject):
            return None
        return subject

    def header(self, origin_seq: int, subject: str, identity: str) -> str:
        """The `Nats-Stream-Source` of a sourced message, in the server's format (2.10+):
        `<stream> <seq> <filters> <destinations> <original subject> <identity>`, filters and
        destinations joined by form feeds (docs/topology.md)."""
        if self.subject_transforms:
            filters = "\f".join(t.src or ">" for t in self.subject_transforms)
            destinations = "\f".join(t.dest or ">" for t in self.subject_transforms)
        else:
            filters, destinations = self.filter_subject or ">", ">"
        return f"{self.name} {origin_seq} {filters} {destinations} {subject} {identity}"


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What the simulation models of a stream's configuration (0: no limit)."""

    name: str
    subjects: tuple[str, ...] = ()
    max_msgs: int = 0
    max_age_ms: int = 0
    max_msgs_per_subject: int = 0
    duplicate_window_ms: int | None = None
    """None or 0: the server's default (`window_ms`)."""
    sources: tuple[SourceConfig, ...] = ()
    placement: str | None = None
    """The cluster (region) it is placed in: partitions and meta-leader loss go by it."""

    def __post_init__(self) -> None:
        if min(self.max_msgs, self.max_age_ms, self.max_msgs_per_subject) < 0:
            raise ValueError(f"stream {self.name}: limits must not be negative (0: none)")
        if 0 < self.max_age_ms < 100:
            raise ValueError(f"stream {self.name}: max age needs to be >= 100ms")

    @property
    def window_ms(self) -> int:
        """The de-duplication window in force."""
        if self.duplicate_window_ms:
            return self.duplicate_window_ms
        if self.sources:
            return 0
        return min(DEFAULT_DUPLICATE_WINDOW_MS, self.max_age_ms or DEFAULT_DUPLICATE_WINDOW_MS)


@dataclass(frozen=True, slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StreamState:
    messages: int
    first_seq: int
    last_seq: int
    consumer_count: int


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """One source as `STREAM.INFO` reports it: `active_ms`, how long ago the stream last
    heard from it (a message or a heartbeat); None when not once since the stream's servers
    started (the server's `active` of -1)."""

    name: str
    active_ms: int | None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    config: StreamConfig
    created: str
    state: StreamState
    sources: tuple[SourceInfo, ...] = ()
    leader_since_ms: int | None = None
    """When the stream's current leader was elected (`cluster.leader_since`)."""


@dataclass(slots=True)
class _Dedup:
    seq: int
    time_ms: int


@dataclass(slots=True)
class Stream:
    config: StreamConfig
    created_ns: int
    consumers: dict[str, Consumer] = field(default_factory=dict)
    _msgs: dict[int, StoredMessage] = field(default_factory=dict)
    _by_subject: dict[str, deque[int]] = field(default_factory=dict)
    """Per subject, its stored sequences in order (only its oldest is ever removed)."""
    _dedup: dict[str, _Dedup] = field(default_factory=dict)
    _first: int = 0
    _last: int = 0
    watcher: Callable[[Stream], None] | None = None
    """Told of every message stored (not of a duplicate dropped)."""

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def created(self) -> str:
        return rfc3339_nano(self.created_ns)

    @property
    def identity(self) -> str:
        return stream_identity(self.created)

    @property
    def first_seq(self) -> int:
        return self._first

    @property
    def last_seq(self) -> int:
        return self._last

    def info(self) -> StreamInfo:
        state = StreamState(len(self._msgs), self._first, self._last, len(self.consumers))
        return StreamInfo(self.config, self.created, state)

    def takes(self, subject: str) -> bool:
        return any(subject_within(subject, pattern) for pattern in self.config.subjects)

    def get(self, seq: int, next_by_subj: str | None = None) -> StoredMessage | None:
        """The message at `seq`; with `next_by_subj` the first at or after `seq` on it."""
        if next_by_subj is None:
            return self._msgs.get(seq)
        return next(self.matching(seq, (next_by_subj,)), None)

    def last_of(self, subject: str) -> StoredMessage | None:
        seqs = self._by_subject.get(subject)
        return self._msgs[seqs[-1]] if seqs else None

    def matching(
        self, start: int, filters: tuple[str, ...] = (), last: int | None = None
    ) -> Iterator[StoredMessage]:
        """The stored messages from `start` on (to `last`), in order, on a subject matching
        one of `filters` (all when none)."""
        end = self._last if last is None else min(last, self._last)
        for seq in range(max(start, self._first), end + 1):
            msg = self._msgs.get(seq)
            if msg is not None and (
                not filters or any(subject_within(msg.subject, f) for f in filters)
            ):
                yield msg

    def store(self, subject: str, data: bytes, headers: Mapping[str, str], now_ms: int) -> PubAck:
        """Store a message (expiry by age is the caller's, before: `expire`)."""
        expected = headers.get(Header.EXPECTED_STREAM)
        if expected is not None and expected != self.name:
            raise api_error(400, STREAM_NOT_MATCH, "expected stream does not match")
        expected = headers.get(Header.EXPECTED_LAST_SUBJECT_SEQUENCE)
        if expected is not None:
            last = self.last_of(subject)
            current = last.seq if last else 0
            if int(expected) != current:
                raise wrong_last_sequence(current)
        expected = headers.get(Header.EXPECTED_LAST_SEQUENCE)
        if expected is not None and int(expected) != self._last:
            raise wrong_last_sequence(self._last)
        msg_id = headers.get(Header.MSG_ID)
        window = self.config.window_ms
        if msg_id and window:
            self._forget_ids(now_ms - window)
            seen = self._dedup.get(msg_id)
            if seen is not None:
                return PubAck(self.name, seen.seq, duplicate=True)
        self._last += 1
        seq = self._last
        if not self._msgs:
            self._first = seq
        self._msgs[seq] = StoredMessage(seq, subject, data, dict(headers), now_ms)
        self._by_subject.setdefault(subject, deque()).append(seq)
        if msg_id and window:
            self._dedup[msg_id] = _Dedup(seq, now_ms)
        per_subject = self.config.max_msgs_per_subject
        if per_subject:
            while len(self._by_subject[subject]) > per_subject:
                self._remove(self._by_subject[subject][0])
        if self.config.max_msgs:
            while len(self._msgs) > self.config.max_msgs:
                self._remove(self._first)
        if self.watcher is not None:
            self.watcher(self)
        return PubAck(self.name, seq)

    def expire(self, now_ms: int) -> None:
        """Remove the messages `max_age_ms` old or older at `now_ms`."""
        max_age = self.config.max_age_ms
        if not max_age:
            return
        while self._msgs:
            first = self._msgs[self._first]
            if first.time_ms + max_age > now_ms:
                return
            self._remove(self._first)

    def next_expiry_ms(self) -> int | None:
        if not self.config.max_age_ms or not self._msgs:
            return None
        return self._msgs[self._first].time_ms + self.config.max_age_ms

    def purge(self, keep: int | None = None) -> int:
        """Remove every message (or all but the last `keep`); returns how many. Every
        consumer moves to the new first sequence, idle ones too."""
        if not self._last:
            return 0
        first = self._last + 1 if not keep else max(self._first, self._last - keep + 1)
        purged = [seq for seq in self._msgs if seq < first]
        for seq in purged:
            self._drop(seq)
        self._first = first if not self._msgs else min(self._msgs)
        for consumer in self.consumers.values():
            consumer.purged(self._first)
        return len(purged)

    def subjects(self, subject_filter: str) -> dict[str, int]:
        """How many messages each stored subject matching `subject_filter` has."""
        return {
            subject: len(seqs)
            for subject, seqs in self._by_subject.items()
            if subject_within(subject, subject_filter)
        }

    def purge_subject(self, subject_filter: str) -> int:
        """Remove every message on a subject matching `subject_filter`; how many went.
        (Consumers are not moved: only key-value buckets, which have none, are purged so.)"""
        subjects = list(self.subjects(subject_filter))
        purged = 0
        for subject in subjects:
            for seq in list(self._by_subject[subject]):
                self._drop(seq)
                purged += 1
        if not self._msgs:
            self._first = self._last + 1
        return purged

    def _remove(self, seq: int) -> None:
        """Removal by a limit: a consumer's pending message there counts as acked."""
        msg = self._drop(seq)
        for consumer in self.consumers.values():
            consumer.removed(msg)

    def _drop(self, seq: int) -> StoredMessage:
        msg = self._msgs.pop(seq)
        seqs = self._by_subject[msg.subject]
        assert seqs[0] == seq, f"{seq} is not the oldest of {msg.subject}"
        seqs.popleft()
        if not seqs:
            del self._by_subject[msg.subject]
        if seq == self._first:
            self._first = next(iter(self._msgs), self._last + 1)
        return msg

    def _forget_ids(self, before_ms: int) -> None:
        """Forget the message ids stored at or before `before_ms` (oldest first)."""
        while self._dedup:
            msg_id, seen = next(iter(self._dedup.items()))
            if seen.time_ms > before_ms:
                return
            del self._dedup[msg_id]
