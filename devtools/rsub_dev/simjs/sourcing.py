"""Sourcing: one `Link` per source of a stream, carrying the origin's messages in order.

A message of the origin reaches the target `delay_ms` after the origin stored it, never
before the one ahead of it on the link, and never while the link is blocked (its stall
switch, or a partition between the two streams' clusters); once unblocked, what waited
arrives at once. It is stored there at its arrival time under the source's subject (filter
and transforms), with the origin's headers but `Nats-Expected-*` and an older
`Nats-Stream-Source`, and a `Nats-Stream-Source` of its own; the target's de-duplication
window applies to its `Nats-Msg-Id`. A message the origin removed (a limit, a purge) before
the link took it never arrives. Each link starts at the origin's first message. After a
restart of a cluster's servers (`SimJetStream.restart`) a link across clusters carries
nothing before it reconnects (`open_since_ms`). The target tells when it last heard from
the origin (`active_ms`: a message or a heartbeat).
"""

from __future__ import annotations

from dataclasses import dataclass

from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.stream import PubAck, SourceConfig, Stream
from sidecar.naming import SOURCE_HEADER

_EXPECTED_PREFIX = "Nats-Expected-"
HEARTBEAT_MS = 1_000
"""A source's idle heartbeat: an open link is heard from at least this often."""


@dataclass(slots=True)
class Link:
    target: str
    source: SourceConfig
    delay_ms: int = 0
    stalled: bool = False
    taken: int = 0
    """The last origin sequence it carried or passed over."""
    open_since_ms: int = 0
    """When it was last unblocked: nothing arrives over it before."""
    last_arrival_ms: int = 0
    heard_ms: int | None = None
    """While blocked or not open yet: when the target last heard from the origin (None: not
    since the link was made or its servers restarted, `SimJetStream.restart`)."""
    place: int = 0
    """Its place among the links, in the order they were made."""
    _ahead: StoredMessage | None = None  # the next message, found once

    @property
    def origin(self) -> str:
        return self.source.name

    def next_message(self, origin: Stream) -> StoredMessage | None:
        """The next origin message it carries (passing over those the source does not take,
        which it never will)."""
        ahead = self._ahead
        if ahead is not None and origin.get(ahead.seq) is ahead:
            return ahead
        self._ahead = None
        if self.taken >= origin.last_seq:
            return None
        for msg in origin.matching(self.taken + 1):
            if self.source.subject_for(msg.subject) is not None:
                self._ahead = msg
                return msg
            self.taken = msg.seq
        self.taken = max(self.taken, origin.last_seq)
        return None

    def active_ms(self, now_ms: int, blocked: bool) -> int | None:
        """How long ago the target last heard from the origin: once open, at the last
        arrival or heartbeat (every `HEARTBEAT_MS` from its opening, the first just after:
        the server's reply to a stream's creation says -1); else as it was left."""
        opening = now_ms == self.open_since_ms and self.last_arrival_ms < now_ms
        if blocked or now_ms < self.open_since_ms or opening:
            return None if self.heard_ms is None else now_ms - self.heard_ms
        beat = self.open_since_ms + (now_ms - self.open_since_ms) // HEARTBEAT_MS * HEARTBEAT_MS
        return now_ms - max(beat, self.last_arrival_ms)

    def restart(self) -> None:
        """Source the origin from its first message (a new stream under the same name)."""
        self.taken, self._ahead = 0, None

    def arrival_ms(self, msg: StoredMessage) -> int:
        return max(msg.time_ms + self.delay_ms, self.open_since_ms, self.last_arrival_ms)

    def carry(self, msg: StoredMessage, origin: Stream, target: Stream, at_ms: int) -> PubAck:
        """Store `msg` in `target` as arrived at `at_ms` (a duplicate: the stored copy's)."""
        subject = self.source.subject_for(msg.subject)
        assert subject is not None
        headers: dict[str, str] = {
            k: v
            for k, v in msg.headers.items()
            if not k.startswith(_EXPECTED_PREFIX) and k != SOURCE_HEADER
        }
        headers[SOURCE_HEADER] = self.source.header(msg.seq, msg.subject, origin.identity)
        ack = target.store(subject, msg.data, headers, at_ms)
        self.taken, self.last_arrival_ms, self._ahead = msg.seq, at_ms, None
        return ack
