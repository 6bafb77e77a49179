"""The simulated JetStream behind the runtime's port: `SimPort` answers every operation of
`sidecar.nats.port.JetStreamPort` from a `SimJetStream`, on the running event loop's virtual
time (looptime), with a delay each way, in the server's JSON where the port speaks it.

`SimNet` is what the regions share: the simulated JetStream, kept settled as virtual time
passes (sourcing, limits by age), the request delays, and the core-NATS signals (`listen`:
acks and consumer advisories, which the simulation's applications and the port's own
consumer operations send).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, TypeVar

from rsub_dev.simjs import (
    ConsumerConfig,
    ConsumerInfo,
    KeyValue,
    KVEntry,
    SimJetStream,
    SourceConfig,
    StreamConfig,
    StreamInfo,
    SubjectTransform,
)
from rsub_dev.simjs.clock import rfc3339_nano
from rsub_dev.simjs.errors import CONSUMER_ALREADY_EXISTS, api_error
from sidecar.nats.port import ApiJson, Listener, Published, StoredMessage
from sidecar.nats.topology import subject_within

T = TypeVar("T")
_NS_PER_MS = 1_000_000


class LoopClock:
    """simjs's clock: the running event loop's time (virtual under looptime), in ms."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def now_ms(self) -> int:
        return int(self._loop.time() * 1000)


class SimNet:
    def __init__(
        self, js: SimJetStream, rng: random.Random, max_delay_ms: int, tail_lag_ms: int = 0
    ) -> None:
        self.js = js
        self.rng = rng
        self.max_delay_ms = max_delay_ms
        self.tail_lag_ms = tail_lag_ms
        """A live read takes up to this much longer again to see what arrived (a slow
        ordered consumer): each of a process's tails lags on its own."""
        self.changed = asyncio.Condition()
        """Notified whenever a stream may hold new messages (live reads wait on it)."""
        self._listeners: list[tuple[str, Callable[[str, bytes], None]]] = []

    async def run(self) -> None:
        """Keep the simulated JetStream settled as virtual time passes (forever)."""
        loop = asyncio.get_running_loop()
        while True:
            due = self.js.next_due_ms()
            now = int(loop.time() * 1000)
            wait_ms = 50 if due is None else max(1, min(due - now, 50))
            await asyncio.sleep(wait_ms / 1000)
            self.js.settle()
            await self.poke()

    async def stored(self, stream: str) -> None:
        """Wait until `stream` may hold new messages (here: until anything may have changed,
        `changed`)."""
        async with self.changed:
            await self.changed.wait()

    async def poke(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def delay(self) -> None:
        await asyncio.sleep(self.rng.randint(0, self.max_delay_ms) / 1000)

    async def lag(self) -> None:
        """What a live read waits besides its delay (`tail_lag_ms`)."""
        if self.tail_lag_ms:
            await asyncio.sleep(self.rng.randint(0, self.tail_lag_ms) / 1000)

    async def call(self, operation: Callable[[], T]) -> T:
        """One request: it reaches the simulated JetStream after a delay, and its reply (or
        the error the server would answer) comes back after another."""
        await self.delay()
        self.js.settle()
        try:
            result = operation()
        finally:
            await self.poke()
        await self.delay()
        return result

    def signal(self, subject: str, payload: bytes = b"") -> None:
        """A core-NATS message on `subject` (an ack, an advisory): heard by the listeners."""
        for pattern, heard in list(self._listeners):
            if subject_within(subject, pattern):
                heard(subject, payload)

    def add_listener(self, subject: str, heard: Callable[[str, bytes], None]) -> _SimListener:
        entry = (subject, heard)
        self._listeners.append(entry)
        return _SimListener(self._listeners, entry)


class ProcessNet(SimNet):
    """One process's view of the shared `SimNet`: the same JetStream, signals and delays,
    and a switch that freezes it (a GC pause, a stalled VM): while frozen, none of its
    requests goes out and no reply or read reaches it; what was under way waits, and lands
    once it wakes (a request sent before the pause, late)."""

    def __init__(self, net: SimNet) -> None:
        self.js, self.rng, self.max_delay_ms = net.js, net.rng, net.max_delay_ms
        self.tail_lag_ms = net.tail_lag_ms
        self.changed = net.changed
        self._listeners = net._listeners
        self.awake = asyncio.Event()
        self.awake.set()

    async def delay(self) -> None:
        await self.awake.wait()
        await super().delay()
        await self.awake.wait()


class _SimListener:
    def __init__(
        self,
        listeners: list[tuple[str, Callable[[str, bytes], None]]],
        entry: tuple[str, Callable[[str, bytes], None]],
    ) -> None:
        self._listeners = listeners
        self._entry = entry

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(self._entry)


class SimBucket:
    """A key-value bucket of the simulated JetStream, each operation a request (`SimNet.call`)."""

    def __init__(self, net: SimNet, kv: KeyValue) -> None:
        self._net = net
        self._kv = kv

    async def get(self, key: str) -> KVEntry:
        return await self._net.call(lambda: self._kv.get(key))

    async def put(self, key: str, value: bytes) -> int:
        return await self._net.call(lambda: self._kv.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        return await self._net.call(lambda: self._kv.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self._net.call(lambda: self._kv.update(key, value, last))

    async def delete(self, key: str, last: int | None = None) -> int:
        return await self._net.call(lambda: self._kv.delete(key, last=last))


class SimPort:
    """`JetStreamPort` over the simulated JetStream (one per sidecar)."""

    def __init__(self, net: SimNet) -> None:
        self._net = net
        self._configs: dict[tuple[str, str], dict[str, Any]] = {}

    # ---- streams ------------------------------------------------------------------------

    async def stream_info(
        self, stream: str, *, subjects_filter: str | None = None, timeout_s: float
    ) -> ApiJson:
        js = self._net.js

        def info() -> ApiJson:
            reply = _stream_info_json(js.stream_info(stream))
            if subjects_filter is not None:
                reply["state"]["subjects"] = js.stream(stream).subjects(subjects_filter)
            return reply

        return await self._net.call(info)

    async def stream_names(self, *, subject: str | None = None, timeout_s: float) -> list[str]:
        return await self._net.call(lambda: self._net.js.stream_names(subject))

    async def stream_create(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        js = self._net.js
        return await self._net.call(
            lambda: _stream_info_json(js.stream_create(_stream_config(config)))
        )

    async def stream_update(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        js = self._net.js
        return await self._net.call(
            lambda: _stream_info_json(js.stream_update(_stream_config(config)))
        )

    async def stream_purge(self, stream: str, subject: str, *, timeout_s: float) -> ApiJson:
        js = self._net.js
        return await self._net.call(
            lambda: {"success": True, "purged": js.stream(stream).purge_subject(subject)}
        )

    async def msg_get(
        self, stream: str, seq: int, *, next_by_subj: str | None = None, timeout_s: float
    ) -> ApiJson | None:
        js = self._net.js

        def get() -> ApiJson | None:
            found = js.stream(stream).get(seq, next_by_subj)
            if found is None:
                return None
            return {
                "subject": found.subject,
                "seq": found.seq,
                "data": base64.b64encode(found.data).decode(),
            }

        return await self._net.call(get)

    async def publish(self, stream: str, subject: str, data: bytes, msg_id: str) -> Published:
        headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Stream": stream}
        ack = await self._net.call(lambda: self._net.js.publish(subject, data, headers))
        return Published(ack.seq, ack.duplicate)

    async def read(
        self,
        stream: str,
        filter_subject: str,
        start_seq: int,
        *,
        live: bool,
        headers_only: bool = False,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[StoredMessage, None]:
        net = self._net
        await net.delay()
        held = net.js.stream(stream)  # a missing stream raises, as the server refuses the read
        last = None if live else held.last_seq
        if live and opened is not None:  # where the real port's consumer is created
            opened()
        next_seq = start_seq
        while True:
            found = list(net.js.stream(stream).matching(next_seq, (filter_subject,), last))
            for msg in found:
                next_seq = msg.seq + 1
                data = b"" if headers_only else msg.data
                yield StoredMessage(msg.seq, msg.subject, data, dict(msg.headers))
            if not live:
                return
            await net.stored(stream)
            await net.delay()
            await net.lag()

    # ---- consumers ----------------------------------------------------------------------

    async def consumer_list(self, stream: str, offset: int, *, timeout_s: float) -> ApiJson:
        def listing() -> ApiJson:
            infos = self._net.js.consumer_list(stream)
            page = [self._consumer_json(i) for i in infos[offset : offset + 256]]
            return {"consumers": page, "total": len(infos), "offset": offset, "limit": 256}

        return await self._net.call(listing)

    async def consumer_info(self, stream: str, name: str, *, timeout_s: float) -> ApiJson:
        return await self._net.call(
            lambda: self._consumer_json(self._net.js.consumer_info(stream, name))
        )

    async def consumer_create(
        self, stream: str, name: str, config: Mapping[str, Any], action: str, *, timeout_s: float
    ) -> ApiJson:
        js = self._net.js

        def create() -> ApiJson:
            exists = any(i.name == name for i in js.consumer_list(stream))
            if action == "create" and exists:
                raise api_error(400, CONSUMER_ALREADY_EXISTS, "consumer already exists")
            if action == "update":
                # Only the metadata changes in an update the product makes.
                js.consumer_info(stream, name)  # not found raises
            else:
                js.consumer_create(stream, _consumer_config(name, config))
            self._configs[(stream, name)] = dict(config)
            return self._consumer_json(js.consumer_info(stream, name))

        return await self._net.call(create)

    async def consumer_reset(
        self, stream: str, name: str, seq: int, *, timeout_s: float
    ) -> ApiJson:
        return await self._net.call(
            lambda: self._consumer_json(self._net.js.consumer_reset(stream, name, seq))
        )

    async def consumer_pause(
        self, stream: str, name: str, seconds: float | None, *, timeout_s: float
    ) -> ApiJson:
        js = self._net.js

        def pause() -> ApiJson:
            until = None if seconds is None else js.now_ms + int(seconds * 1000)
            info = js.consumer_pause(stream, name, until)
            return {"paused": info.paused}

        return await self._net.call(pause)

    # ---- key-value and signals ----------------------------------------------------------

    async def key_value(self, bucket: str) -> SimBucket:
        return SimBucket(self._net, await self._net.call(lambda: self._net.js.key_value(bucket)))

    async def listen(self, subject: str, heard: Callable[[str, bytes], None]) -> Listener:
        return self._net.add_listener(subject, heard)

    def _consumer_json(self, info: ConsumerInfo) -> ApiJson:
        config = self._configs.get((info.stream, info.name)) or _config_json(info.config)
        return {
            "stream_name": info.stream,
            "name": info.name,
            "config": config,
            "delivered": {
                "consumer_seq": info.delivered.consumer_seq,
                "stream_seq": info.delivered.stream_seq,
            },
            "ack_floor": {
                "consumer_seq": info.ack_floor.consumer_seq,
                "stream_seq": info.ack_floor.stream_seq,
            },
            "num_pending": info.num_pending,
            "num_ack_pending": info.num_ack_pending,
            "paused": info.paused,
            "pause_remaining": info.pause_remaining_ms * 1_000_000,
        }


def _stream_info_json(info: StreamInfo) -> ApiJson:
    config, state = info.config, info.state
    reply: ApiJson = {
        "config": _stream_config_json(config),
        "created": info.created,
        "state": {
            "messages": state.messages,
            "first_seq": state.first_seq,
            "last_seq": state.last_seq,
            "consumer_count": state.consumer_count,
        },
    }
    if info.sources:
        # `active`: nanoseconds since it last heard from the source, -1 when not once.
        reply["sources"] = [
            {"name": s.name, "active": -1 if s.active_ms is None else s.active_ms * 1_000_000}
            for s in info.sources
        ]
    if config.placement is not None:
        reply["cluster"] = {"name": config.placement}
        if info.leader_since_ms is not None:
            reply["cluster"]["leader_since"] = rfc3339_nano(info.leader_since_ms * 1_000_000)
    return reply


def _stream_config_json(config: StreamConfig) -> ApiJson:
    """What simjs models of a stream's configuration, in the server's JSON (durations in
    ns, no limit as -1)."""
    body: ApiJson = {
        "name": config.name,
        "subjects": list(config.subjects),
        "max_msgs": config.max_msgs or -1,
        "max_age": config.max_age_ms * _NS_PER_MS,
        "max_msgs_per_subject": config.max_msgs_per_subject or -1,
        "duplicate_window": (config.duplicate_window_ms or 0) * _NS_PER_MS,
        "num_replicas": 1,
    }
    if config.sources:
        body["sources"] = [_source_json(source) for source in config.sources]
    if config.placement is not None:
        body["placement"] = {"cluster": config.placement}
    return body


def _source_json(source: SourceConfig) -> ApiJson:
    body: ApiJson = {"name": source.name}
    if source.filter_subject is not None:
        body["filter_subject"] = source.filter_subject
    if source.subject_transforms:
        body["subject_transforms"] = [
            {"src": t.src, "dest": t.dest} for t in source.subject_transforms
        ]
    return body


def _stream_config(config: Mapping[str, Any]) -> StreamConfig:
    """A stream configuration in the server's JSON as simjs models it (the fields it does
    not model, such as `max_consumers` or `allow_direct`, are left out)."""
    return StreamConfig(
        name=str(config["name"]),
        subjects=tuple(config.get("subjects") or ()),
        max_msgs=max(0, int(config.get("max_msgs", -1))),
        max_age_ms=int(config.get("max_age", 0)) // _NS_PER_MS,
        max_msgs_per_subject=max(0, int(config.get("max_msgs_per_subject", -1))),
        duplicate_window_ms=int(config.get("duplicate_window", 0)) // _NS_PER_MS or None,
        sources=tuple(
            SourceConfig(
                str(source["name"]),
                source.get("filter_subject") or None,
                tuple(
                    SubjectTransform(str(t.get("src", "")), str(t.get("dest", "")))
                    for t in source.get("subject_transforms") or ()
                ),
            )
            for source in config.get("sources") or ()
        ),
        placement=(config.get("placement") or {}).get("cluster"),
    )


def _config_json(config: ConsumerConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "durable_name": config.durable_name,
        "ack_policy": "explicit",
        "deliver_policy": config.deliver_policy,
        "metadata": dict(config.metadata),
    }
    if config.opt_start_seq:
        body["opt_start_seq"] = config.opt_start_seq
    if len(config.filter_subjects) == 1:
        body["filter_subject"] = config.filter_subjects[0]
    elif config.filter_subjects:
        body["filter_subjects"] = list(config.filter_subjects)
    return body


def _consumer_config(name: str, config: Mapping[str, Any]) -> ConsumerConfig:
    single = config.get("filter_subject")
    filters = tuple(config.get("filter_subjects") or ([single] if single else []))
    policy = str(config.get("deliver_policy", "all"))
    start = int(config.get("opt_start_seq", 0)) if policy == "by_start_sequence" else 0
    return ConsumerConfig(
        durable_name=name,
        filter_subjects=filters,
        deliver_policy="by_start_sequence" if start else "all",
        opt_start_seq=start,
        metadata=dict(config.get("metadata") or {}),
    )
