"""The sidecar's settings: every section of its configuration file, each checking itself
when built (`sidecar.config.checks`). Loading a file and the environment is `loading`."""

from __future__ import annotations

import fnmatch
import functools
import re
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.config.checks import (
    NOT_NEGATIVE,
    Problem,
    Section,
    cert_and_key,
    existing_file,
    not_negative,
    positive_setting,
    setting,
)
from sidecar.config.nats import NatsConfig
from sidecar.config.secrets import Secret
from sidecar.logs import LogFormat, LogLevel
from sidecar.naming import (
    DEFAULT_READ_STREAM,
    DEFAULT_WRITE_STREAM,
    TOKEN_PATTERN,
    NamingError,
    VirtualStream,
)

# What the checks allow, in JSON Schema terms (a stream pattern's full rule is the naming
# contract's, checked with the streams: `Config._check`).
_NAME = {"pattern": TOKEN_PATTERN}


def _stream_pattern(meaning: str) -> dict[str, Any]:
    """The metadata of a stream name's pattern over {name} and {region}."""
    return setting(meaning, json={"pattern": r"\{region\}"}, kind="pattern")


# JetStream KV bucket names (the lease bucket).
BUCKET_RE = re.compile(r"[A-Za-z0-9_-]+")
_JETSTREAM_MAX_REPLICAS = 5
_REPLICAS = {"minimum": 1, "maximum": _JETSTREAM_MAX_REPLICAS}


def _regions(value: tuple[str, ...]) -> str | None:
    # Region names themselves are checked with the streams (VirtualStream, in Config._check).
    return None if value else "must list at least one region"


def _unique_streams(value: tuple[StreamConfig, ...]) -> str | None:
    # An empty list is checked with `discovery` (Config._check): it needs discovery on.
    dups = _duplicates(s.name for s in value)
    return f"duplicate stream name(s) {dups}" if dups else None


# What a glob on virtual-stream names may hold: name characters and fnmatch's wildcards.
_GLOB_RE = re.compile(r"[A-Za-z0-9_*?\[\]!-]+")


def _globs(value: tuple[str, ...]) -> str | None:
    if not value:
        return "must list at least one glob"
    bad = [glob for glob in value if not _GLOB_RE.fullmatch(glob)]
    if bad:
        return (
            f"invalid glob(s) {bad}: a virtual-stream name holds letters, digits, '_' and '-'; "
            "the wildcards are *, ? and [...]"
        )
    return None


def _bucket(value: str) -> str | None:
    if BUCKET_RE.fullmatch(value):
        return None
    return f"invalid KV bucket name {value!r}: must match {BUCKET_RE.pattern}"


def _replicas(value: int) -> str | None:
    if 1 <= value <= _JETSTREAM_MAX_REPLICAS:
        return None
    return f"must be between 1 and {_JETSTREAM_MAX_REPLICAS}, got {value}"


def split_host_port(listen: str) -> tuple[str, int]:
    """Split a listen address `host:port` (`[::1]:7070` for IPv6); raise ValueError if bad."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"invalid listen address {listen!r}: expected host:port")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"invalid listen address {listen!r}: unbalanced IPv6 brackets")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {listen!r}: write IPv6 hosts as [addr]:port")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid listen address {listen!r}: port must be 0-65535")
    return host, int(port_text)


def _listen(value: str) -> str | None:
    try:
        split_host_port(value)
    except ValueError as exc:
        return str(exc)
    return None


def _cluster_names(value: Mapping[str, str]) -> str | None:
    bad = [name for name in value.values() if not name or any(c.isspace() for c in name)]
    return f"invalid cluster name(s) {bad}" if bad else None


@dataclass(frozen=True)
class StreamConfig(Section):
    """A virtual stream; `write_stream`/`read_stream` are patterns over {name} and {region}."""

    name: str = field(
        metadata=setting(
            "virtual stream name `V`: `[A-Za-z0-9][A-Za-z0-9_-]*` (so never starting with `_`)",
            json=_NAME,
            kind="name",
        )
    )
    write_stream: str = field(
        default=DEFAULT_WRITE_STREAM,
        metadata=_stream_pattern(
            "name of each region's write stream; placeholders `{name}` and `{region}`, both "
            "required"
        ),
    )
    read_stream: str = field(
        default=DEFAULT_READ_STREAM,
        metadata=_stream_pattern(
            "name of each region's read stream; must not collide with the write streams"
        ),
    )
    replicas: int = field(
        default=1,
        metadata=setting("JetStream replicas of streams that rsub creates", _replicas, _REPLICAS),
    )


@dataclass(frozen=True)
class DiscoveryConfig(Section):
    """Streams found, not listed: every `interval_s` the sidecar lists the account's streams
    and serves each virtual stream whose name matches a glob of `match` and whose read and
    write streams in this region exist, named by `read_stream`/`write_stream` (patterns over
    {name} and {region}, as for a listed stream). It never creates their streams."""

    enabled: bool = field(
        default=False,
        metadata=setting(
            "also serve the virtual streams found in the account (see [Discovery](#discovery))"
        ),
    )
    match: tuple[str, ...] = field(
        default=("*",),
        metadata=setting(
            "names of the virtual streams to follow: `*`, `?` and `[...]` over "
            "`[A-Za-z0-9_-]`, case-sensitive; a stream is followed when any glob matches",
            _globs,
            {"minItems": 1, "items": {"pattern": f"^{_GLOB_RE.pattern}$"}},
            kind="list of globs",
        ),
    )
    interval_s: float = field(
        default=30.0,
        metadata=positive_setting("how often the account's streams are listed"),
    )
    write_stream: str = field(
        default=DEFAULT_WRITE_STREAM,
        metadata=_stream_pattern(
            "name of each region's write stream of a discovered stream, as `streams[].write_stream`"
        ),
    )
    read_stream: str = field(
        default=DEFAULT_READ_STREAM,
        metadata=_stream_pattern(
            "name of each region's read stream of a discovered stream, as "
            "`streams[].read_stream`; the streams are found through it"
        ),
    )

    def matches(self, name: str) -> bool:
        """Whether the virtual-stream `name` matches one of the globs (case-sensitive)."""
        return any(fnmatch.fnmatchcase(name, glob) for glob in self.match)

    def virtual_stream(self, name: str, regions: tuple[str, ...]) -> VirtualStream:
        """The naming contract of the discovered stream `name` (NamingError if it breaks it)."""
        return VirtualStream(
            name=name,
            regions=regions,
            write_pattern=self.write_stream,
            read_pattern=self.read_stream,
        )


@dataclass(frozen=True)
class SnapshotConfig(Section):
    interval_ms: int = field(
        default=1000,
        metadata=positive_setting("how often a snapshot may start (DESIGN §3.1)"),
    )
    timeout_s: float = field(
        default=30.0,
        metadata=positive_setting("an incomplete snapshot attempt is dropped after this"),
    )
    cache_size: int = field(
        default=30,
        metadata=positive_setting("snapshots cached per replicated subscription"),
    )
    sweep_intervals: int = field(
        default=120,
        metadata=positive_setting(
            "every stream's positions are read at least once per this many intervals, "
            "whatever the signals say ([design](design.md#work-that-follows-traffic)); a "
            "missed signal delays an update by at most this"
        ),
    )


@dataclass(frozen=True)
class ProgressConfig(Section):
    """Progress vectors (DESIGN §7): the read stream's origins are indexed, vectors are sent
    with updates and applied. Off, rsub is PIP-33 only (for comparison, or to save the index)."""

    enabled: bool = field(
        default=True,
        metadata=setting(
            "progress vectors (DESIGN §7): index the read stream's origins, send vectors with "
            "updates and apply the ones received; `false` is PIP-33 only (no index, no "
            "headers-only tail)"
        ),
    )
    interval_ms: int | None = field(
        default=None,
        metadata=positive_setting(
            "how often a subscription's changed progress vector may go out, and its positions "
            "be read after a signal; null: `snapshot.interval_ms` (the sidecar's interval loop "
            "ticks at the shorter of the two; snapshots still start once per "
            "`snapshot.interval_ms`). Vectors need no round trip: a shorter cadence means an "
            "exact client receives less twice after a failover, for more position reads and "
            "markers ([benchmarks](benchmarks.md#progress-cadence))"
        ),
    )


@dataclass(frozen=True)
class FailbackConfig(Section):
    """The failback guard (docs/protocol.md §7): a region that returns holds its replicated
    durables until every other region told it what they consumed meanwhile, for `hold_s` at
    most (0: no guard)."""

    hold_s: float = field(
        default=120.0,
        metadata=setting(
            "the failback guard ([protocol](protocol.md#7-the-failback-guard)): a region that "
            "returns (its servers restarted, no other region heard since) holds its replicated "
            "durables until every other region has answered a catch-up request, for this many "
            "seconds at most; `0` turns it off",
            not_negative,
            NOT_NEGATIVE,
        ),
    )


@dataclass(frozen=True)
class LeaseConfig(Section):
    bucket: str = field(
        default="rsub-leases",
        metadata=setting(
            "prefix of the region's KV bucket `<bucket>-<region>` (e.g. `rsub-leases-west`) "
            "holding the leases (one per shard, design §5), the members and the external "
            "cursors, `[A-Za-z0-9_-]+`",
            _bucket,
            {"pattern": f"^{BUCKET_RE.pattern}$"},
            kind="KV bucket name",
        ),
    )
    ttl_s: float = field(
        default=10.0,
        metadata=positive_setting(
            "lease time-to-live; the holder renews every `ttl/3`; a dead replica's streams "
            "are taken over about one TTL after its last renewal"
        ),
    )
    # The shards' leases: sidecar/nats/shards.py.
    shards: int = field(
        default=32,
        metadata=positive_setting(
            "shards the streams are split into, each led by one replica: what the replicas "
            "of a region share (`ceil(shards / replicas)` each). Same value on every replica; "
            "1 makes one replica lead every stream and the others stand by"
        ),
    )
    # The bucket is opened by `open_regional_kv` (sidecar/nats/regional_kv.py).
    replicas: int | None = field(
        default=None,
        metadata=setting(
            "replicas of the region's KV bucket (leases, members, cursors); null: as many as "
            "the region's cluster can place, up to 3 (1 on a one-server cluster, logged at "
            "info level as `kv_bucket_replicas_reduced`). A bucket found with fewer is raised "
            "by a stream update, never lowered; one that cannot be raised is used as it is, "
            "logged as `kv_bucket_replicas_low`: a warning when `lease.replicas` is set, info "
            "level when null (a cluster too small for more is then expected). With one "
            "replica, losing the server that holds it stops leadership and `CommitCursor` in "
            "the region",
            _replicas,
            _REPLICAS,
        ),
    )


@dataclass(frozen=True)
class GrpcTlsConfig(Section):
    cert_file: Path | None = field(
        default=None,
        metadata=setting("server certificate; set with `key_file`; must exist", existing_file),
    )
    key_file: Path | None = field(
        default=None, metadata=setting("server key; must exist", existing_file)
    )
    client_ca_file: Path | None = field(
        default=None,
        metadata=setting(
            "require client certificates signed by this CA; needs server TLS", existing_file
        ),
    )

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[Problem]:
        yield from cert_and_key(v)
        if v.get("client_ca_file") is not None and v.get("cert_file") is None:
            yield "client_ca_file", "client certificates need server TLS (cert_file, key_file)"

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True)
class GrpcConfig(Section):
    listen: str = field(
        default="127.0.0.1:7070",
        metadata=setting(
            "gRPC API address; IPv6 as `[::]:7070`; port 0 picks a free port",
            _listen,
            kind="`host:port`",
        ),
    )
    auth_token: Secret | None = field(
        default=None,
        metadata=setting("bearer token required by AdminService and CommitCursor"),
    )
    tls: GrpcTlsConfig = field(default_factory=GrpcTlsConfig)


@dataclass(frozen=True)
class HttpConfig(Section):
    listen: str = field(
        default="127.0.0.1:8080",
        metadata=setting("`/healthz`, `/readyz`, `/metrics`", _listen, kind="`host:port`"),
    )


@dataclass(frozen=True)
class LogConfig(Section):
    format: LogFormat = field(
        default="auto", metadata=setting("`auto`: JSON lines unless stdout is a terminal")
    )
    level: LogLevel = field(
        default="info",
        metadata=setting("applies to rsub's logs and to library logs (nats, aiohttp, grpc)"),
    )


# How many configured stream names an unknown stream's error lists.
_NAMES_SHOWN = 20

# NamingError messages start with the VirtualStream field at fault; map it to our key.
_NAMING_FIELDS = {"name": "name", "write_pattern": "write_stream", "read_pattern": "read_stream"}


@dataclass(frozen=True)
class Config(Section):
    region: str = field(metadata=setting("this sidecar's region; must be one of `regions`"))
    regions: tuple[str, ...] = field(
        metadata=setting(
            "every region of the super-cluster; unique names matching `[A-Za-z0-9][A-Za-z0-9_-]*`",
            _regions,
            {"minItems": 1, "uniqueItems": True, "items": _NAME},
            kind="list of names",
        )
    )
    nats: NatsConfig
    streams: tuple[StreamConfig, ...] = field(
        default=(),
        metadata=setting(
            "the virtual streams this sidecar serves, unique names; at least one unless "
            "`discovery.enabled`",
            _unique_streams,
        ),
    )
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    cluster_for_region: Mapping[str, str] = field(
        default_factory=lambda: types.MappingProxyType({}),
        metadata=setting(
            "NATS cluster hosting a region's streams; a region not listed uses a cluster "
            "named like the region",
            _cluster_names,
            {"additionalProperties": {"pattern": r"^\S+$"}},
            kind="map region → cluster",
        ),
    )
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    failback: FailbackConfig = field(default_factory=FailbackConfig)
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[Problem]:
        discovery: DiscoveryConfig | None = v.get("discovery")
        if "streams" in v and not v["streams"] and discovery is not None and not discovery.enabled:
            yield "streams", "must list at least one stream, or turn discovery on"
        regions: tuple[str, ...] | None = v.get("regions")
        if not regions:
            return
        if "region" in v and v["region"] not in regions:
            yield "region", f"{v['region']!r} is not in regions {list(regions)}"
        for region in v.get("cluster_for_region", {}):
            if region not in regions:
                yield f"cluster_for_region.{region}", f"unknown region {region!r}"
        reported: set[tuple[str, str]] = set()
        for i, stream in enumerate(v.get("streams", ())):
            try:
                _virtual_stream(stream, regions)
            except NamingError as exc:
                field_name, _, problem = str(exc).partition(": ")
                if field_name == "regions":
                    key = "regions"
                elif field_name in _NAMING_FIELDS:
                    key = f"streams[{i}].{_NAMING_FIELDS[field_name]}"
                else:
                    key, problem = f"streams[{i}]", str(exc)
                if (key, problem) not in reported:  # region problems repeat for every stream
                    reported.add((key, problem))
                    yield key, problem
        if discovery is not None:
            # The patterns are checked with the name `x`; should a found name still break the
            # naming contract, discovery skips it and logs why.
            try:
                discovery.virtual_stream("x", regions)
            except NamingError as exc:
                field_name, _, problem = str(exc).partition(": ")
                if field_name in ("write_pattern", "read_pattern"):
                    yield f"discovery.{_NAMING_FIELDS[field_name]}", problem

    def cluster_for(self, region: str) -> str:
        """The NATS cluster that hosts `region`'s streams (defaults to the region's name)."""
        return self.cluster_for_region.get(region, region)

    @functools.cached_property
    def _streams_by_name(self) -> Mapping[str, StreamConfig]:
        # A bring-up looks up every stream: a scan each time was quadratic in the streams.
        return {s.name: s for s in self.streams}

    def stream(self, name: str) -> StreamConfig:
        try:
            return self._streams_by_name[name]
        except KeyError:
            shown = [s.name for s in self.streams[:_NAMES_SHOWN]]
            more = (
                f" and {len(self.streams) - len(shown)} more"
                if len(self.streams) > len(shown)
                else ""
            )
            raise KeyError(f"unknown stream {name!r}; configured: {shown}{more}") from None

    def virtual_stream(self, name: str) -> VirtualStream:
        """The naming contract (stream names, subjects) of the configured stream `name`."""
        return _virtual_stream(self.stream(name), self.regions)

    @property
    def virtual_streams(self) -> tuple[VirtualStream, ...]:
        return tuple(_virtual_stream(s, self.regions) for s in self.streams)


def _virtual_stream(stream: StreamConfig, regions: tuple[str, ...]) -> VirtualStream:
    return VirtualStream(
        name=stream.name,
        regions=regions,
        write_pattern=stream.write_stream,
        read_pattern=stream.read_stream,
    )


def _duplicates(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for item in items:
        if item in seen and item not in dups:
            dups.append(item)
        seen.add(item)
    return dups
