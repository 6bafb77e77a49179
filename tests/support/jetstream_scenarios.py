"""One scenario interface over JetStream, and two implementations: a real nats-server (over
nats-py, through `sidecar.nats.jsapi` wherever it has the call) and the simulated JetStream
(`rsub_dev.simjs`). tests/dev/test_simjs_conformance.py runs the same scenarios over both and
compares what they saw.

The interface is operation-shaped, as the runtime's port to JetStream is, and speaks the
simulation's types: the real implementation maps the server's JSON onto them. Errors are
compared through `Failure`: the nats-py class the error is (the simulation's errors subclass
the real ones), with its codes and description.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue as NatsKeyValue

from rsub_dev.simjs import (
    ConsumerConfig,
    ConsumerInfo,
    Delivery,
    KVEntry,
    ManualClock,
    PubAck,
    SequencePair,
    SimJetStream,
    SourceConfig,
    SourceInfo,
    StoredMessage,
    StreamConfig,
    StreamInfo,
    StreamState,
    SubjectTransform,
)
from rsub_dev.simjs.errors import SimNotFound
from sidecar.nats import jsapi
from sidecar.nats.port import NO_MESSAGE_FOUND

_TIMEOUT_S = 2.0
_NS_PER_MS = 1_000_000
# How long a fetch waits for messages on the real server: scenarios fetch only when some are
# stored (a pull still waiting when one arrives would take it).
_FETCH_TIMEOUT_S = 1.0
_SOURCED_WITHIN_S = 15.0

T = TypeVar("T")


class JetStreamScenario(Protocol):
    async def stream_create(self, config: StreamConfig) -> StreamInfo: ...
    async def stream_info(self, stream: str) -> StreamInfo: ...
    async def stream_purge(self, stream: str, keep: int | None = None) -> int: ...
    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PubAck: ...
    async def msg_get(
        self, stream: str, seq: int, next_by_subj: str | None = None
    ) -> StoredMessage | None: ...
    async def consumer_create(self, stream: str, config: ConsumerConfig) -> ConsumerInfo: ...
    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo: ...
    async def consumer_reset(self, stream: str, name: str, seq: int) -> ConsumerInfo: ...
    async def consumer_pause(self, stream: str, name: str, paused: bool) -> ConsumerInfo: ...
    async def fetch(self, stream: str, name: str, batch: int) -> list[Delivery]: ...
    async def ack(self, stream: str, name: str, stream_seq: int) -> None: ...
    async def kv_bucket_create(self, bucket: str, ttl_ms: int) -> None: ...
    async def kv_get(self, bucket: str, key: str) -> KVEntry: ...
    async def kv_put(self, bucket: str, key: str, value: bytes) -> int: ...
    async def kv_create(self, bucket: str, key: str, value: bytes) -> int: ...
    async def kv_update(self, bucket: str, key: str, value: bytes, last: int) -> int: ...
    async def kv_delete(self, bucket: str, key: str, last: int | None = None) -> None: ...
    async def wait(self, ms: int) -> None:
        """Let `ms` pass (the real one sleeps; the simulated one moves its clock)."""
        ...

    async def wait_sourced(self, stream: str, last_seq: int) -> None:
        """Let sourcing bring `stream` to `last_seq` (the real one polls, within a deadline)."""
        ...


@dataclass(frozen=True)
class Failure:
    """An operation's error, as compared: its nats-py class and what the server said."""

    kind: str
    code: int | None
    err_code: int | None
    description: str | None
    op: str | None  # a key-value marker's operation (a deleted key)


def failure(err: Exception) -> Failure:
    kind = next(c.__name__ for c in type(err).__mro__ if c.__module__.startswith("nats."))
    return Failure(
        kind,
        getattr(err, "code", None),
        getattr(err, "err_code", None),
        getattr(err, "description", None),
        getattr(err, "op", None),
    )


async def attempt(call: Awaitable[T]) -> T | Failure:
    """`call`'s result, or its failure when it raised a (real or simulated) nats error."""
    try:
        return await call
    except Exception as err:
        if not any(c.__module__.startswith("nats.") for c in type(err).__mro__):
            raise
        return failure(err)


# ---- the simulated JetStream --------------------------------------------------------------


class SimScenario:
    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.clock = ManualClock(start_ms)
        self.js = SimJetStream(self.clock)

    async def stream_create(self, config: StreamConfig) -> StreamInfo:
        return self.js.stream_create(config)

    async def stream_info(self, stream: str) -> StreamInfo:
        return self.js.stream_info(stream)

    async def stream_purge(self, stream: str, keep: int | None = None) -> int:
        return self.js.stream_purge(stream, keep)

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PubAck:
        return self.js.publish(subject, data, headers)

    async def msg_get(
        self, stream: str, seq: int, next_by_subj: str | None = None
    ) -> StoredMessage | None:
        try:
            return self.js.msg_get(stream, seq, next_by_subj)
        except SimNotFound as err:
            if err.err_code == NO_MESSAGE_FOUND:
                return None  # as `jsapi.msg_get` answers
            raise

    async def consumer_create(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        return self.js.consumer_create(stream, config)

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return self.js.consumer_info(stream, name)

    async def consumer_reset(self, stream: str, name: str, seq: int) -> ConsumerInfo:
        return self.js.consumer_reset(stream, name, seq)

    async def consumer_pause(self, stream: str, name: str, paused: bool) -> ConsumerInfo:
        until = self.clock.now_ms() + 60_000 if paused else None
        return self.js.consumer_pause(stream, name, until)

    async def fetch(self, stream: str, name: str, batch: int) -> list[Delivery]:
        return self.js.fetch(stream, name, batch)

    async def ack(self, stream: str, name: str, stream_seq: int) -> None:
        self.js.ack(stream, name, stream_seq)

    async def kv_bucket_create(self, bucket: str, ttl_ms: int) -> None:
        self.js.kv_bucket_create(bucket, ttl_ms)

    async def kv_get(self, bucket: str, key: str) -> KVEntry:
        return self.js.key_value(bucket).get(key)

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        return self.js.key_value(bucket).put(key, value)

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int:
        return self.js.key_value(bucket).create(key, value)

    async def kv_update(self, bucket: str, key: str, value: bytes, last: int) -> int:
        return self.js.key_value(bucket).update(key, value, last)

    async def kv_delete(self, bucket: str, key: str, last: int | None = None) -> None:
        self.js.key_value(bucket).delete(key, last)

    async def wait(self, ms: int) -> None:
        self.clock.advance(ms)

    async def wait_sourced(self, stream: str, last_seq: int) -> None:
        self.js.settle()


# ---- a real nats-server -------------------------------------------------------------------


class RealScenario:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self._subs: dict[tuple[str, str], JetStreamContext.PullSubscription] = {}
        self._delivered: dict[tuple[str, str, int], Msg] = {}
        self._kv: dict[str, NatsKeyValue] = {}

    async def _api(self, op: str, payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await jsapi.request(self.nc, op, payload, timeout_s=_TIMEOUT_S)

    async def stream_create(self, config: StreamConfig) -> StreamInfo:
        reply = await self._api(f"STREAM.CREATE.{config.name}", _stream_json(config))
        return _stream_info(reply)

    async def stream_info(self, stream: str) -> StreamInfo:
        return _stream_info(await self._api(f"STREAM.INFO.{stream}"))

    async def stream_purge(self, stream: str, keep: int | None = None) -> int:
        reply = await self._api(f"STREAM.PURGE.{stream}", {"keep": keep} if keep else {})
        return int(reply["purged"])

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PubAck:
        ack = await self.js.publish(subject, data, headers=dict(headers or {}) or None)
        return PubAck(ack.stream, ack.seq, bool(ack.duplicate))

    async def msg_get(
        self, stream: str, seq: int, next_by_subj: str | None = None
    ) -> StoredMessage | None:
        message = await jsapi.msg_get(
            self.nc, stream, seq, next_by_subj=next_by_subj, timeout_s=_TIMEOUT_S
        )
        if message is None:
            return None
        hdrs = message.get("hdrs")
        return StoredMessage(
            int(message["seq"]),
            str(message["subject"]),
            base64.b64decode(message.get("data") or ""),
            _headers(base64.b64decode(hdrs)) if hdrs else {},
            _unix_ms(str(message["time"])),
        )

    async def consumer_create(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        body = {"stream_name": stream, "config": _consumer_json(config), "action": "create"}
        return _consumer_info(
            await self._api(f"CONSUMER.CREATE.{stream}.{config.durable_name}", body)
        )

    async def consumer_info(self, stream: str, name: str) -> ConsumerInfo:
        return _consumer_info(await self._api(f"CONSUMER.INFO.{stream}.{name}"))

    async def consumer_reset(self, stream: str, name: str, seq: int) -> ConsumerInfo:
        return _consumer_info(await self._api(f"CONSUMER.RESET.{stream}.{name}", {"seq": seq}))

    async def consumer_pause(self, stream: str, name: str, paused: bool) -> ConsumerInfo:
        body: dict[str, Any] = {}
        if paused:
            until = datetime.fromtimestamp(time.time() + 60).astimezone()
            body["pause_until"] = until.isoformat()
        await self._api(f"CONSUMER.PAUSE.{stream}.{name}", body)
        return await self.consumer_info(stream, name)

    async def fetch(self, stream: str, name: str, batch: int) -> list[Delivery]:
        sub = self._subs.get((stream, name))
        if sub is None:
            sub = self._subs[(stream, name)] = await self.js.pull_subscribe_bind(name, stream)
        try:
            msgs = await sub.fetch(batch, timeout=_FETCH_TIMEOUT_S)
        except TimeoutError:
            return []
        out: list[Delivery] = []
        for msg in msgs:
            meta = msg.metadata
            self._delivered[(stream, name, meta.sequence.stream)] = msg
            out.append(
                Delivery(
                    meta.sequence.stream,
                    meta.sequence.consumer,
                    msg.subject,
                    msg.data,
                    dict(msg.headers or {}),
                    meta.num_pending,
                )
            )
        return out

    async def ack(self, stream: str, name: str, stream_seq: int) -> None:
        await self._delivered.pop((stream, name, stream_seq)).ack_sync()

    async def kv_bucket_create(self, bucket: str, ttl_ms: int) -> None:
        config = KeyValueConfig(bucket=bucket, history=1, ttl=ttl_ms / 1000 or None)
        self._kv[bucket] = await self.js.create_key_value(config)

    async def kv_get(self, bucket: str, key: str) -> KVEntry:
        entry = await self._kv[bucket].get(key)
        return KVEntry(bucket, key, entry.value or b"", int(entry.revision or 0))

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        return await self._kv[bucket].put(key, value)

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int:
        return await self._kv[bucket].create(key, value)

    async def kv_update(self, bucket: str, key: str, value: bytes, last: int) -> int:
        return await self._kv[bucket].update(key, value, last=last)

    async def kv_delete(self, bucket: str, key: str, last: int | None = None) -> None:
        await self._kv[bucket].delete(key, last=last)

    async def wait(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    async def wait_sourced(self, stream: str, last_seq: int) -> None:
        deadline = time.monotonic() + _SOURCED_WITHIN_S
        while time.monotonic() < deadline:
            if (await self.stream_info(stream)).state.last_seq >= last_seq:
                return
            await asyncio.sleep(0.05)


def _stream_json(config: StreamConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": config.name,
        "subjects": list(config.subjects),
        "storage": "file",
        "max_msgs": config.max_msgs or -1,
        "max_age": config.max_age_ms * _NS_PER_MS,
        "max_msgs_per_subject": config.max_msgs_per_subject or -1,
    }
    if config.duplicate_window_ms is not None:
        body["duplicate_window"] = config.duplicate_window_ms * _NS_PER_MS
    if config.sources:
        body["sources"] = [_source_json(s) for s in config.sources]
    return body


def _source_json(source: SourceConfig) -> dict[str, Any]:
    body: dict[str, Any] = {"name": source.name}
    if source.filter_subject is not None:
        body["filter_subject"] = source.filter_subject
    if source.subject_transforms:
        body["subject_transforms"] = [
            {"src": t.src, "dest": t.dest} for t in source.subject_transforms
        ]
    return body


def _stream_info(reply: Mapping[str, Any]) -> StreamInfo:
    cfg, state = reply["config"], reply["state"]
    config = StreamConfig(
        name=cfg["name"],
        subjects=tuple(cfg.get("subjects") or ()),
        max_msgs=max(int(cfg.get("max_msgs", -1)), 0),
        max_age_ms=int(cfg.get("max_age", 0)) // _NS_PER_MS,
        max_msgs_per_subject=max(int(cfg.get("max_msgs_per_subject", -1)), 0),
        duplicate_window_ms=int(cfg.get("duplicate_window", 0)) // _NS_PER_MS,
        sources=tuple(
            SourceConfig(
                s["name"],
                s.get("filter_subject"),
                tuple(
                    SubjectTransform(t.get("src", ""), t.get("dest", ""))
                    for t in s.get("subject_transforms") or ()
                ),
            )
            for s in cfg.get("sources") or ()
        ),
    )
    return StreamInfo(
        config,
        str(reply["created"]),
        StreamState(
            int(state["messages"]),
            int(state["first_seq"]),
            int(state["last_seq"]),
            int(state.get("consumer_count", 0)),
        ),
        tuple(_source_info(s) for s in reply.get("sources") or ()),
    )


def _source_info(source: Mapping[str, Any]) -> SourceInfo:
    """`active` in ns, -1 when the stream has not heard from the source (None)."""
    active = int(source.get("active", -1))
    return SourceInfo(str(source["name"]), None if active < 0 else active // _NS_PER_MS)


def _consumer_json(config: ConsumerConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "durable_name": config.durable_name,
        "ack_policy": "explicit",
        "deliver_policy": config.deliver_policy,
    }
    if config.opt_start_seq:
        body["opt_start_seq"] = config.opt_start_seq
    if len(config.filter_subjects) == 1:
        body["filter_subject"] = config.filter_subjects[0]
    elif config.filter_subjects:
        body["filter_subjects"] = list(config.filter_subjects)
    if config.metadata:
        body["metadata"] = dict(config.metadata)
    return body


def _consumer_info(reply: Mapping[str, Any]) -> ConsumerInfo:
    cfg = reply["config"]
    filters = cfg.get("filter_subjects") or (
        [cfg["filter_subject"]] if cfg.get("filter_subject") else []
    )
    config = ConsumerConfig(
        durable_name=cfg["durable_name"],
        filter_subjects=tuple(filters),
        deliver_policy=cfg["deliver_policy"],
        opt_start_seq=int(cfg.get("opt_start_seq", 0)),
        metadata={
            k: v for k, v in (cfg.get("metadata") or {}).items() if not k.startswith("_nats.")
        },
    )
    delivered, floor = reply["delivered"], reply["ack_floor"]
    return ConsumerInfo(
        stream=reply["stream_name"],
        name=reply["name"],
        config=config,
        delivered=SequencePair(int(delivered["consumer_seq"]), int(delivered["stream_seq"])),
        ack_floor=SequencePair(int(floor["consumer_seq"]), int(floor["stream_seq"])),
        num_pending=int(reply["num_pending"]),
        num_ack_pending=int(reply["num_ack_pending"]),
        paused=bool(reply.get("paused", False)),
    )


def _headers(raw: bytes) -> dict[str, str]:
    """The headers of a `STREAM.MSG.GET` reply (`NATS/1.0` then `Name: value` lines)."""
    out: dict[str, str] = {}
    for line in raw.decode().split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def _unix_ms(rfc3339: str) -> int:
    whole, _, rest = rfc3339.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(whole + "+00:00").timestamp()
    return int(seconds * 1000) + int((rest or "0").ljust(3, "0")[:3])
