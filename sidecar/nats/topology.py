"""Creates, checks and adopts the write and read streams of a virtual stream.

`apply_topology` brings the streams of one `VirtualStream` to the layout of the naming
contract (docs/topology.md) and reports, per stream, what it created, updated or left alone.
It adopts in place a layout made by hand in the style of the NATS "virtual global stream"
walkthrough, without re-sourcing anything; it refuses (`TopologyConflict`) what it cannot
adopt safely.

It talks to the JetStream API through the port (`JetStreamPort`: stream info, names,
create, update, message get) with the server's JSON, so that an update sends back every
field of the server's own configuration untouched, apart from the ones it means to change.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from nats.aio.client import Client
from nats.js.errors import APIError

from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import STREAM_NOT_FOUND, JetStreamPort

log = structlog.get_logger(__name__)

JsonDict = dict[str, Any]

# nats-server 2.15 treats max_consumers -1 as 1000; rsub states a limit of its own.
DEFAULT_MAX_CONSUMERS = 10_000
# Write streams de-duplicate the sidecar's marker retries; read streams de-duplicate markers
# (which carry a unique Nats-Msg-Id) should a source ever deliver them twice.
WRITE_DUPLICATE_WINDOW_NS = 2 * 60 * 1_000_000_000
READ_DUPLICATE_WINDOW_NS = 10 * 60 * 1_000_000_000

_SCAN_BATCH = 64
_SETTLE_S = 0.5
_SETTLE_ROUNDS = 20

StreamChange = Literal["created", "updated", "unchanged"]
"""What `apply_topology` did to one stream."""
Role = Literal["write", "read"]


class TopologyError(Exception):
    """The topology could not be applied; the message names the stream and the field."""

    def __init__(self, stream: str, field: str, message: str) -> None:
        super().__init__(f"stream {stream!r}, {field}: {message}")
        self.stream = stream
        self.field = field


class TopologyConflict(TopologyError):
    """An existing stream cannot be adopted without losing, re-sourcing or mixing data."""


@dataclass(frozen=True)
class StreamReport:
    stream: str
    region: str
    role: Role
    action: StreamChange
    fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def as_dict(self) -> JsonDict:
        return {
            "stream": self.stream,
            "region": self.region,
            "role": self.role,
            "action": self.action,
            "fields": list(self.fields),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class TopologyReport:
    vstream: str
    dry_run: bool
    streams: tuple[StreamReport, ...]

    @property
    def changed(self) -> bool:
        return any(s.action != "unchanged" for s in self.streams)

    def as_dict(self) -> JsonDict:
        return {
            "vstream": self.vstream,
            "dry_run": self.dry_run,
            "changed": self.changed,
            "streams": [s.as_dict() for s in self.streams],
        }


class _JsApi:
    """The topology's JetStream calls, through the port; their errors become TopologyErrors."""

    def __init__(self, port: JetStreamPort, timeout: float) -> None:
        self._port = port
        self._timeout = timeout

    async def stream_info(self, name: str) -> JsonDict | None:
        try:
            return await self._port.stream_info(name, timeout_s=self._timeout)
        except APIError as err:
            if err.err_code == STREAM_NOT_FOUND:
                return None
            raise TopologyError(name, "info", str(err.description)) from err

    async def put_stream(self, op: Literal["CREATE", "UPDATE"], cfg: JsonDict, field: str) -> None:
        put = self._port.stream_create if op == "CREATE" else self._port.stream_update
        try:
            await put(cfg, timeout_s=self._timeout)
        except APIError as err:
            raise TopologyError(cfg["name"], field, f"server refused: {err.description}") from err

    async def streams_with_subject(self, subject: str) -> list[str]:
        return await self._port.stream_names(subject=subject, timeout_s=self._timeout)

    async def message_meta(self, stream: str, seq: int) -> tuple[str | None, str] | None:
        """(Nats-Stream-Source header or None, time) of message `seq`; None if absent."""
        try:
            message = await self._port.msg_get(stream, seq, timeout_s=self._timeout)
        except APIError as err:
            raise TopologyError(stream, "messages", str(err.description)) from err
        if message is None:
            return None
        hdrs = message.get("hdrs")
        header = _header_value(base64.b64decode(hdrs), SOURCE_HEADER) if hdrs else None
        return header, str(message["time"])


def _header_value(raw: bytes, key: str) -> str | None:
    for line in raw.decode(errors="replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == key.lower():
            return value.strip()
    return None


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both filters `a` and `b`."""
    ta, tb = a.split("."), b.split(".")
    for x, y in zip(ta, tb, strict=False):
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(ta) == len(tb)


def subject_within(inner: str, outer: str) -> bool:
    """Whether every subject matched by `inner` is matched by `outer`."""
    i, o = inner.split("."), outer.split(".")
    for n, tok in enumerate(o):
        if tok == ">":
            return len(i) > n
        if n >= len(i) or (tok != "*" and tok != i[n]) or (tok == "*" and i[n] == ">"):
            return False
    return len(i) == len(o)


@dataclass
class _Plan:
    """What one stream needs: the target configuration and the fields that differ."""

    stream: str
    region: str
    role: Role
    existing: JsonDict | None
    config: JsonDict
    fields: list[str] = field(default_factory=list)
    # Origins (write stream names) whose source must be (re)attached at the right position.
    resume: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _data_transform(vs: VirtualStream, region: str) -> JsonDict:
    return {"src": vs.data_subject(region), "dest": vs.data_filter()}


def _marker_transform(vs: VirtualStream, region: str) -> JsonDict:
    marker = vs.marker_subject(region)
    return {"src": marker, "dest": marker}


def _source(vs: VirtualStream, region: str) -> JsonDict:
    return {
        "name": vs.write_stream(region),
        "subject_transforms": [_data_transform(vs, region), _marker_transform(vs, region)],
    }


def _is_canonical_source(vs: VirtualStream, region: str, src: Mapping[str, Any]) -> bool:
    if src.get("filter_subject") or src.get("external") or src.get("consumer"):
        return False
    marker = vs.marker_subject(region)
    got = sorted(
        (t.get("src"), t.get("dest") or t.get("src")) for t in src.get("subject_transforms") or []
    )
    want = sorted([(vs.data_subject(region), vs.data_filter()), (marker, marker)])
    return got == want


def _walkthrough_rename(vs: VirtualStream) -> JsonDict:
    return {"src": f"{vs.name}.*.>", "dest": vs.data_filter()}


class _Planner:
    def __init__(
        self,
        api: _JsApi,
        vs: VirtualStream,
        cluster_for_region: Callable[[str], str | None],
        replicas: int | None,
        max_consumers: int,
    ) -> None:
        self.api = api
        self.vs = vs
        self.cluster_for_region = cluster_for_region
        self.replicas = replicas
        self.max_consumers = max_consumers

    def _new_config(self, name: str, region: str, subjects: list[str], dup_ns: int) -> JsonDict:
        cfg: JsonDict = {
            "name": name,
            "subjects": subjects,
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "num_replicas": self.replicas or 1,
            "max_consumers": self.max_consumers,
            "duplicate_window": dup_ns,
        }
        cluster = self.cluster_for_region(region)
        if cluster is not None:
            cfg["placement"] = {"cluster": cluster}
        return cfg

    async def _check_common(self, region: str, info: JsonDict, plan: _Plan) -> None:
        cfg = plan.config
        name = plan.stream
        if cfg.get("retention", "limits") != "limits":
            raise TopologyConflict(
                name,
                "retention",
                f"is {cfg['retention']!r}; rsub needs 'limits' (markers and data must stay "
                "readable by every consumer and by a restarting sidecar)",
            )
        if cfg.get("mirror"):
            raise TopologyConflict(name, "mirror", "a mirror cannot be a virtual-stream stream")
        cluster = self.cluster_for_region(region)
        actual = (info.get("cluster") or {}).get("name")
        if cluster is not None and actual != cluster:
            raise TopologyConflict(
                name, "placement.cluster", f"lives in cluster {actual!r}, expected {cluster!r}"
            )
        if cfg.get("max_consumers", -1) <= 0:
            cfg["max_consumers"] = self.max_consumers
            plan.fields.append("max_consumers")

    async def _check_free(self, stream: str, subjects: Iterable[str]) -> None:
        """Refuse subjects that another stream of the account already captures."""
        for subject in subjects:
            others = [s for s in await self.api.streams_with_subject(subject) if s != stream]
            if others:
                raise TopologyConflict(
                    stream,
                    "subjects",
                    f"{subject!r} overlaps the subjects of stream(s) {', '.join(sorted(others))}",
                )

    def _check_foreign_subjects(self, stream: str, subjects: list[str], own: list[str]) -> None:
        vs = self.vs
        for subject in subjects:
            if any(subject_within(subject, o) for o in own):
                continue
            if subjects_overlap(subject, vs.data_filter()) or subjects_overlap(
                subject, vs.marker_filter()
            ):
                raise TopologyConflict(
                    stream,
                    "subjects",
                    f"{subject!r} reaches into the subjects of virtual stream {vs.name!r} "
                    f"(allowed: {', '.join(own)})",
                )

    async def plan_write(self, region: str) -> _Plan:
        vs = self.vs
        name = vs.write_stream(region)
        wanted = [vs.data_subject(region), vs.marker_subject(region)]
        info = await self.api.stream_info(name)
        if info is None:
            await self._check_free(name, wanted)
            cfg = self._new_config(name, region, wanted, WRITE_DUPLICATE_WINDOW_NS)
            return _Plan(name, region, "write", None, cfg)
        plan = _Plan(name, region, "write", info["config"], copy.deepcopy(info["config"]))
        await self._check_common(region, info, plan)
        cfg = plan.config
        if cfg.get("sources"):
            raise TopologyConflict(name, "sources", "a write stream must not source other streams")
        if cfg.get("subject_transform"):
            raise TopologyConflict(
                name, "subject_transform", "a write stream must keep its subjects as published"
            )
        subjects: list[str] = list(cfg.get("subjects") or [])
        self._check_foreign_subjects(name, subjects, wanted)
        if vs.data_subject(region) not in subjects:
            raise TopologyConflict(
                name,
                "subjects",
                f"{subjects} does not capture {vs.data_subject(region)!r} as a whole "
                "(adopting it would change what the write stream holds)",
            )
        missing = [s for s in wanted if s not in subjects]
        if missing:
            await self._check_free(name, missing)
            cfg["subjects"] = subjects + missing
            plan.fields.append("subjects")
        return plan

    async def plan_read(self, region: str) -> _Plan:
        vs = self.vs
        name = vs.read_stream(region)
        own = [vs.snapshot_subject(region)]
        info = await self.api.stream_info(name)
        if info is None:
            await self._check_free(name, own)
            cfg = self._new_config(name, region, own, READ_DUPLICATE_WINDOW_NS)
            cfg["sources"] = [_source(vs, r) for r in vs.regions]
            cfg["allow_direct"] = True
            return _Plan(name, region, "read", None, cfg)
        plan = _Plan(name, region, "read", info["config"], copy.deepcopy(info["config"]))
        await self._check_common(region, info, plan)
        cfg = plan.config
        subjects: list[str] = list(cfg.get("subjects") or [])
        self._check_foreign_subjects(name, subjects, own)
        if own[0] not in subjects:
            await self._check_free(name, own)
            cfg["subjects"] = [*subjects, *own]
            plan.fields.append("subjects")
        if not cfg.get("allow_direct"):
            # Readers (the Spark source) use direct gets: they need no consumer, so they keep
            # working in a region cut off from the JetStream meta leader.
            cfg["allow_direct"] = True
            plan.fields.append("allow_direct")
        sources = self._check_sources(name, cfg)
        stream_transform = cfg.get("subject_transform")
        walkthrough = _walkthrough_rename(vs)
        if stream_transform:
            if {k: stream_transform.get(k) for k in ("src", "dest")} != walkthrough:
                raise TopologyConflict(
                    name,
                    "subject_transform",
                    f"{stream_transform} would rename differently from "
                    f"{walkthrough['src']!r} -> {walkthrough['dest']!r}",
                )
            del cfg["subject_transform"]
            plan.fields.append("subject_transform")
        kept: list[JsonDict] = []
        for r in vs.regions:
            src = sources.get(vs.write_stream(r))
            if src is not None and not stream_transform and _is_canonical_source(vs, r, src):
                kept.append(src)
                continue
            if src is not None and not self._is_adoptable_source(r, src, bool(stream_transform)):
                raise TopologyConflict(
                    name,
                    f"sources[{src['name']}]",
                    f"{_describe_source(src)} cannot be adopted: expected a filter "
                    f"{vs.data_subject(r)!r} renamed by the stream transform "
                    f"{walkthrough['src']!r} -> {walkthrough['dest']!r}, or the rsub transforms "
                    f"{_describe_source(_source(vs, r))}",
                )
            plan.resume.append(vs.write_stream(r))
        if plan.resume:
            plan.fields.append("sources")
        cfg["sources"] = kept
        return plan

    def _check_sources(self, name: str, cfg: JsonDict) -> dict[str, JsonDict]:
        vs = self.vs
        sources: dict[str, JsonDict] = {}
        for src in cfg.get("sources") or []:
            origin = src.get("name", "")
            if vs.region_of_write_stream(origin) is None:
                raise TopologyConflict(
                    name,
                    f"sources[{origin}]",
                    f"sources {origin!r}, which is not a write stream of {vs.name!r} "
                    f"(expected {', '.join(vs.write_stream(r) for r in vs.regions)})",
                )
            if origin in sources:
                raise TopologyConflict(
                    name,
                    f"sources[{origin}]",
                    "sources the same write stream twice; one source per write stream keeps "
                    "the data and markers of an origin in order",
                )
            sources[origin] = src
        return sources

    def _is_adoptable_source(self, region: str, src: Mapping[str, Any], renamed: bool) -> bool:
        """A walkthrough source: filter V.r.> (renamed by the stream transform), or the same
        source already renaming V.r.> -> V.> by itself; nothing more, nothing less."""
        if src.get("external") or src.get("consumer"):
            return False
        data = self.vs.data_subject(region)
        transforms = src.get("subject_transforms") or []
        if renamed:
            return src.get("filter_subject") == data and not transforms
        return not src.get("filter_subject") and [
            {"src": t.get("src"), "dest": t.get("dest")} for t in transforms
        ] == [_data_transform(self.vs, region)]


def _describe_source(src: Mapping[str, Any]) -> str:
    parts = [f"source {src.get('name')!r}"]
    if src.get("filter_subject"):
        parts.append(f"filter {src['filter_subject']!r}")
    for t in src.get("subject_transforms") or []:
        parts.append(f"transform {t.get('src')!r} -> {t.get('dest')!r}")
    return ", ".join(parts)


async def _last_origin_positions(
    api: _JsApi, vs: VirtualStream, stream: str, origins: set[str]
) -> tuple[dict[str, int], JsonDict]:
    """Last origin sequence of each origin in `origins` found in read stream `stream`,
    scanning backwards; also returns the stream state the scan started from."""
    info = await api.stream_info(stream)
    if info is None:
        raise TopologyError(stream, "state", "stream disappeared during adoption")
    state: JsonDict = info["state"]
    found: dict[str, int] = {}
    top, first = int(state.get("last_seq", 0)), max(1, int(state.get("first_seq", 1)))
    while top >= first and len(found) < len(origins):
        seqs = range(top, max(first, top - _SCAN_BATCH + 1) - 1, -1)
        metas = await asyncio.gather(*(api.message_meta(stream, s) for s in seqs))
        for meta in metas:
            origin = vs.origin_of(meta[0]) if meta and meta[0] else None
            if origin is not None:
                found.setdefault(vs.write_stream(origin[0]), origin[1])
        top = seqs[-1] - 1
    return {o: s for o, s in found.items() if o in origins}, state


async def _settled_positions(
    api: _JsApi, vs: VirtualStream, stream: str, origins: set[str]
) -> tuple[dict[str, int], JsonDict]:
    """Positions of paused origins, once two scans a moment apart agree (a message the
    detached source had already handed to the stream may still be landing)."""
    previous, state = await _last_origin_positions(api, vs, stream, origins)
    for _ in range(_SETTLE_ROUNDS):
        await asyncio.sleep(_SETTLE_S)
        current, state = await _last_origin_positions(api, vs, stream, origins)
        if current == previous:
            return current, state
        previous = current
    raise TopologyError(stream, "sources", "positions of detached sources did not settle")


def _resume_sources(
    vs: VirtualStream, plan: _Plan, positions: Mapping[str, int], state: Mapping[str, Any]
) -> list[JsonDict]:
    """Sources for the origins in plan.resume, starting after what the stream already holds."""
    added: list[JsonDict] = []
    for origin in plan.resume:
        region = vs.region_of_write_stream(origin)
        assert region is not None  # plan.resume only holds write streams of vs
        src = _source(vs, region)
        if origin in positions:
            src["opt_start_seq"] = positions[origin] + 1
            plan.notes.append(f"{origin} resumes at origin seq {positions[origin] + 1}")
        elif int(state.get("first_seq", 0)) > 1 and state.get("last_ts"):
            # Messages were removed and none of this origin is left: its position is unknown.
            # Start where nats-server itself would after losing its state: the last stored time.
            src["opt_start_time"] = state["last_ts"]
            plan.notes.append(
                f"{origin}: no message left in the stream, resumes at time {state['last_ts']}"
            )
        else:
            plan.notes.append(f"{origin} never sourced before: starts at its first message")
        added.append(src)
    return added


async def _execute(api: _JsApi, vs: VirtualStream, plan: _Plan) -> None:
    if plan.existing is None:
        await api.put_stream("CREATE", plan.config, "config")
        return
    if not plan.resume:
        await api.put_stream("UPDATE", plan.config, ", ".join(plan.fields))
        return
    # Detach the sources that change first: a changed source gets a new internal name and the
    # server would re-source its whole origin. Then resume each one right after its last
    # message held by the stream (see docs/topology.md).
    await api.put_stream("UPDATE", plan.config, ", ".join(plan.fields))
    positions, state = await _settled_positions(api, vs, plan.stream, set(plan.resume))
    cfg = copy.deepcopy(plan.config)
    cfg["sources"] = [*cfg["sources"], *_resume_sources(vs, plan, positions, state)]
    await api.put_stream("UPDATE", cfg, "sources")


async def apply_topology(
    target: Client | JetStreamPort,
    vstream: VirtualStream,
    *,
    cluster_for_region: Callable[[str], str | None] = lambda r: r,
    replicas: int | None = None,
    max_consumers: int = DEFAULT_MAX_CONSUMERS,
    dry_run: bool = False,
    request_timeout: float = 10.0,
) -> TopologyReport:
    """Create, update or adopt the write and read streams of `vstream`.

    `cluster_for_region` names the cluster a region's streams are placed in (None: no
    placement). `replicas` applies to streams created here; existing streams keep theirs.
    With `dry_run`, nothing changes and the report says what would. Raises
    `TopologyConflict` when an existing stream cannot be adopted; checks every stream before
    changing any.
    """
    if replicas is not None and replicas < 1:
        raise ValueError(f"replicas: must be at least 1, got {replicas}")
    if max_consumers < 1:
        raise ValueError(f"max_consumers: must be at least 1, got {max_consumers}")
    port = NatsPort(target) if isinstance(target, Client) else target
    api = _JsApi(port, request_timeout)
    planner = _Planner(api, vstream, cluster_for_region, replicas, max_consumers)
    plans = [await planner.plan_write(r) for r in vstream.regions]
    plans += [await planner.plan_read(r) for r in vstream.regions]
    reports: list[StreamReport] = []
    for plan in plans:
        action: StreamChange = (
            "created" if plan.existing is None else "updated" if plan.fields else "unchanged"
        )
        if action != "unchanged" and not dry_run:
            await _execute(api, vstream, plan)
            log.info(
                "topology.stream_applied",
                vstream=vstream.name,
                stream=plan.stream,
                action=action,
                fields=plan.fields,
                notes=plan.notes,
            )
        elif dry_run and plan.resume:
            plan.notes.extend(
                f"{o}: source will resume after its last message held here" for o in plan.resume
            )
        reports.append(
            StreamReport(
                plan.stream, plan.region, plan.role, action, tuple(plan.fields), tuple(plan.notes)
            )
        )
    return TopologyReport(vstream.name, dry_run, tuple(reports))
