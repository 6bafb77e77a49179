"""A simulated JetStream for deterministic simulation (developer tools only: never imported
by `sidecar` or `spark_jobs`).

Pure Python and deterministic: no wall clock, no sleeping, no randomness but the
`random.Random` it is given (for random faults). Time is a `Clock` it is given (`now_ms()`),
and everything time-based (limits by age, key-value TTLs, sourcing delays, pauses, the
de-duplication window) is evaluated against it. What it models, what it does not, and how it
is checked against a real nats-server: docs/simulation.md.

    clock = ManualClock()
    js = SimJetStream(clock, rng=random.Random(seed))
    js.stream_create(StreamConfig("orders-write-east", ("orders.east.>",), placement="east"))
    js.publish("orders.east.a", b"data", {"Nats-Msg-Id": "1"})
    clock.advance(1_000)
    js.faults.fail_next(Op.CONSUMER_RESET, Fault.TIMEOUT)

Modules: `stream` (streams, limits, purges, de-duplication), `sourcing` (links with delays,
stalls and partitions), `consumer` (durable pull consumers), `kv` (key-value buckets),
`faults`, `errors`, `subjects`, `clock`; `jetstream` puts them together.
"""

from rsub_dev.simjs.clock import Clock, ManualClock
from rsub_dev.simjs.consumer import (
    ConsumerConfig,
    ConsumerInfo,
    Delivery,
    SequencePair,
)
from rsub_dev.simjs.errors import SimJSError
from rsub_dev.simjs.faults import NEEDS_META, Fault, Faults, Op
from rsub_dev.simjs.jetstream import SimJetStream
from rsub_dev.simjs.kv import KeyValue, KVEntry
from rsub_dev.simjs.message import StoredMessage
from rsub_dev.simjs.stream import (
    PubAck,
    SourceConfig,
    SourceInfo,
    StreamConfig,
    StreamInfo,
    StreamState,
    stream_identity,
)
from rsub_dev.simjs.subjects import SubjectTransform

__all__ = [
    "NEEDS_META",
    "Clock",
    "ConsumerConfig",
    "ConsumerInfo",
    "Delivery",
    "Fault",
    "Faults",
    "KVEntry",
    "KeyValue",
    "ManualClock",
    "Op",
    "PubAck",
    "SequencePair",
    "SimJSError",
    "SimJetStream",
    "SourceConfig",
    "SourceInfo",
    "StoredMessage",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "SubjectTransform",
    "stream_identity",
]
