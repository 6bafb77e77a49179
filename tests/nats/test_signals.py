"""The consumers' signals (`sidecar.nats.signals`): which acks settle a message, on the
subjects a real nats-server gives its deliveries."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.js import JetStreamContext

from sidecar.nats import signals
from sidecar.nats.port import JetStreamPort


@pytest.mark.parametrize(
    ("subject", "payload", "settled"),
    [
        ("$JS.ACK.S.app.1.42.7.1700000000000000000.3", b"+ACK", ("app", 42)),
        ("$JS.ACK.S.app.1.42.7.1700000000000000000.3", b"", ("app", 42)),
        ("$JS.ACK.S.app.2.43.8.1700000000000000000.0", b'+NXT {"batch":1}', ("app", 43)),
        ("$JS.ACK.S.app.3.44.9.1700000000000000000.0", b"+TERM poisoned", ("app", 44)),
        ("$JS.ACK.S.app.1.42.7.1700000000000000000.3", b"-NAK", None),
        ("$JS.ACK.S.app.1.42.7.1700000000000000000.3", b"+WPI", None),
        ("$JS.EVENT.ADVISORY.CONSUMER.CREATED.S.app", b"{}", None),
        ("$JS.ACK.S.app.1.x.7.1700000000000000000.3", b"+ACK", None),
        ("$JS.ACK.S.app.1.42", b"+ACK", None),
    ],
)
def test_an_ack_settles_its_message_a_nak_or_progress_does_not(
    subject: str, payload: bytes, settled: tuple[str, int] | None
) -> None:
    assert signals.settled(subject, payload) == settled


@pytest.mark.integration
async def test_the_acks_of_a_real_server_name_their_consumer_and_sequence(
    port: JetStreamPort, js: JetStreamContext
) -> None:
    stream = f"S{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    for i in range(4):
        await js.publish(f"{stream}.x", str(i).encode())
    acked: list[tuple[str, int]] = []
    moved: list[int] = []
    listeners = await signals.follow_consumers(
        port, stream, lambda: moved.append(1), lambda c, s: acked.append((c, s))
    )
    sub = await js.pull_subscribe(f"{stream}.>", durable="app")
    first, second, third, fourth = await sub.fetch(4, timeout=5)
    await first.ack()
    await second.nak(delay=60)
    await third.term()
    await fourth.in_progress()
    for _ in range(50):
        if len(moved) >= 5:  # the creation's advisory and four acks
            break
        await asyncio.sleep(0.1)
    for listener in listeners:
        await listener.stop()
    assert acked == [("app", 1), ("app", 3)]
    assert len(moved) >= 5
