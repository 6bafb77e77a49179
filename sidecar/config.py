"""Typed sidecar configuration: a YAML file plus `RSUB_*` environment overrides.

Every section is a frozen dataclass; the loader walks the dataclasses' type hints, so the
schema is written once. Loading collects every problem before failing and raises a single
`ConfigError` whose lines read `key.path: problem`.

Environment overrides: `RSUB_<KEY>` with `__` between nesting levels (`RSUB_NATS__SERVERS`,
`RSUB_SNAPSHOT__INTERVAL_MS`). Scalars are parsed to the declared type, lists of scalars
are comma separated, lists of sections and maps are YAML flow text
(`RSUB_STREAMS='[{name: orders}]'`), and an empty value sets an optional key to null.
An `RSUB_` variable that names no key is an error when it looks like a mistyped setting, and
is otherwise ignored (Kubernetes service links, for one); docs/configuration.md has the rule.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from sidecar.logs import LogFormat, LogLevel
from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM, NamingError, VirtualStream

ENV_PREFIX = "RSUB_"

# JetStream KV bucket names (the lease bucket).
BUCKET_RE = re.compile(r"[A-Za-z0-9_-]+")
_NATS_URL_RE = re.compile(r"(nats|tls|ws|wss)://([^/?#@]+@)?[^/?#@:]+(:\d+)?/?")
_JETSTREAM_MAX_REPLICAS = 5
# A URL's user info: from after `scheme://` (or the start of a scheme-less `user:pw@host`) to
# the last `@` before a blank, quote, comma or bracket (a password may hold a raw `@` or `/`).
_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)?[^\s'\",()\[\]{}<>]*@")


def hide_userinfo(text: str) -> str:
    """`text` with the user info of every URL in it (`nats://user:password@host`, also
    without a scheme) shown as `***`: server URLs may carry a password."""
    return _USERINFO_RE.sub(lambda m: f"{m[1] or ''}***@", text)


def repr_hiding_userinfo(self: Any) -> str:
    """A dataclass's repr, field by field as dataclasses write it, with URL user info hidden
    (`__repr__` of the dataclasses that hold server URLs, which may carry a password)."""
    shown = ", ".join(
        f"{f.name}={hide_userinfo(repr(getattr(self, f.name)))}"
        for f in dataclasses.fields(self)
        if f.repr
    )
    return f"{type(self).__qualname__}({shown})"


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one `key.path: problem` line each, with
    any URL user info hidden (a problem may quote a server URL)."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = [hide_userinfo(problem) for problem in problems]
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"invalid configuration{where} ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n  ".join([header, *self.problems]))


class Secret:
    """A string that never shows in `repr`, `str` or log output; `reveal()` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


# Field checks: each takes the converted value and returns a problem or None.
Check = Callable[[Any], str | None]


def _meta(check: Check) -> dict[str, Check]:
    return {"check": check}


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be positive, got {value}"


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else f"must not be negative, got {value}"


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


def _nats_urls(value: tuple[str, ...]) -> str | None:
    if not value:
        return "must list at least one server"
    bad = [url for url in value if not _NATS_URL_RE.fullmatch(url)]
    if bad:
        return f"invalid server URL(s) {bad}: expected nats://host[:port] (or tls, ws, wss)"
    return None


def _existing_file(path: Path) -> str | None:
    return None if path.is_file() else f"file not found: {path}"


def _cluster_names(value: Mapping[str, str]) -> str | None:
    bad = [name for name in value.values() if not name or any(c.isspace() for c in name)]
    return f"invalid cluster name(s) {bad}" if bad else None


def _cert_and_key(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if (v.get("cert_file") is None) != (v.get("key_file") is None):
        key = "key_file" if v.get("key_file") is None else "cert_file"
        yield key, "cert_file and key_file must be set together"


# A section's `_check(values)` sees its converted keys (defaults filled in; keys that failed
# conversion absent) and yields (key, problem) for rules spanning several keys.


@dataclass(frozen=True)
class NatsTlsConfig:
    ca_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    cert_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    key_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    server_name: str | None = None

    _check = staticmethod(_cert_and_key)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.ca_file, self.cert_file, self.server_name))


@dataclass(frozen=True)
class NatsConfig:
    servers: tuple[str, ...] = field(metadata=_meta(_nats_urls))
    user: str | None = None
    password: Secret | None = None
    token: Secret | None = None
    creds_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    tls: NatsTlsConfig = field(default_factory=NatsTlsConfig)
    connect_timeout_s: float = field(default=5.0, metadata=_meta(_positive))

    __repr__ = repr_hiding_userinfo

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
        has = {key: v.get(key) is not None for key in ("user", "password", "token", "creds_file")}
        if has["user"] != has["password"]:
            yield (
                "user" if has["password"] else "password",
                "user and password must be set together",
            )
        methods = [
            method
            for method, used in (
                ("user/password", has["user"] or has["password"]),
                ("token", has["token"]),
                ("creds_file", has["creds_file"]),
            )
            if used
        ]
        if len(methods) > 1:
            yield (
                "token" if has["token"] else "creds_file",
                f"choose one authentication method, got {' and '.join(methods)}",
            )


@dataclass(frozen=True)
class StreamConfig:
    """A virtual stream; `write_stream`/`read_stream` are patterns over {name} and {region}."""

    name: str
    write_stream: str = DEFAULT_WRITE_STREAM
    read_stream: str = DEFAULT_READ_STREAM
    replicas: int = field(default=1, metadata=_meta(_replicas))


@dataclass(frozen=True)
class DiscoveryConfig:
    """Streams found, not listed: every `interval_s` the sidecar lists the account's streams
    and serves each virtual stream whose name matches a glob of `match` and whose read and
    write streams in this region exist, named by `read_stream`/`write_stream` (patterns over
    {name} and {region}, as for a listed stream). It never creates their streams."""

    enabled: bool = False
    match: tuple[str, ...] = field(default=("*",), metadata=_meta(_globs))
    interval_s: float = field(default=30.0, metadata=_meta(_positive))
    write_stream: str = DEFAULT_WRITE_STREAM
    read_stream: str = DEFAULT_READ_STREAM

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
class SnapshotConfig:
    interval_ms: int = field(default=1000, metadata=_meta(_positive))
    timeout_s: float = field(default=30.0, metadata=_meta(_positive))
    cache_size: int = field(default=30, metadata=_meta(_positive))
    sweep_intervals: int = field(default=120, metadata=_meta(_positive))
    """Every stream's positions are read at least once per this many intervals, whatever
    the signals say (a missed signal only delays an update by as much)."""


@dataclass(frozen=True)
class ProgressConfig:
    """Progress vectors (DESIGN §7): the read stream's origins are indexed, vectors are sent
    with updates and applied. Off, rsub is PIP-33 only (for comparison, or to save the index)."""

    enabled: bool = True
    interval_ms: int | None = field(default=None, metadata=_meta(_positive))
    """How often a subscription's changed vector may go out, and its positions be read on a
    signal: vectors need no round trip, so they may go out more often than snapshots start.
    None: `snapshot.interval_ms`."""


@dataclass(frozen=True)
class FailbackConfig:
    """The failback guard (docs/protocol.md §7): a region that returns holds its replicated
    durables until every other region told it what they consumed meanwhile, for `hold_s` at
    most (0: no guard)."""

    hold_s: float = field(default=120.0, metadata=_meta(_not_negative))


@dataclass(frozen=True)
class LeaseConfig:
    bucket: str = field(default="rsub-leases", metadata=_meta(_bucket))
    ttl_s: float = field(default=10.0, metadata=_meta(_positive))
    # Streams are split into this many shards, each with its own lease: the unit of work
    # the replicas of a region share (sidecar/nats/shards.py). Same value on every replica.
    shards: int = field(default=32, metadata=_meta(_positive))
    # Replicas of the region's KV bucket (leases, members, cursors: `open_regional_kv`).
    # None: as many as the region's cluster can place, up to 3.
    replicas: int | None = field(default=None, metadata=_meta(_replicas))


@dataclass(frozen=True)
class GrpcTlsConfig:
    cert_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    key_file: Path | None = field(default=None, metadata=_meta(_existing_file))
    client_ca_file: Path | None = field(default=None, metadata=_meta(_existing_file))

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
        yield from _cert_and_key(v)
        if v.get("client_ca_file") is not None and v.get("cert_file") is None:
            yield "client_ca_file", "client certificates need server TLS (cert_file, key_file)"

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True)
class GrpcConfig:
    listen: str = field(default="127.0.0.1:7070", metadata=_meta(_listen))
    auth_token: Secret | None = None
    tls: GrpcTlsConfig = field(default_factory=GrpcTlsConfig)


@dataclass(frozen=True)
class HttpConfig:
    listen: str = field(default="127.0.0.1:8080", metadata=_meta(_listen))


@dataclass(frozen=True)
class LogConfig:
    format: LogFormat = "auto"
    level: LogLevel = "info"


# NamingError messages start with the VirtualStream field at fault; map it to our key.
_NAMING_FIELDS = {"name": "name", "write_pattern": "write_stream", "read_pattern": "read_stream"}


@dataclass(frozen=True)
class Config:
    region: str
    regions: tuple[str, ...] = field(metadata=_meta(_regions))
    nats: NatsConfig
    streams: tuple[StreamConfig, ...] = field(default=(), metadata=_meta(_unique_streams))
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    cluster_for_region: Mapping[str, str] = field(
        default_factory=lambda: types.MappingProxyType({}), metadata=_meta(_cluster_names)
    )
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    failback: FailbackConfig = field(default_factory=FailbackConfig)
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
        """Build a Config from parsed YAML-like data, applying `RSUB_*` overrides from `env`."""
        return _build(data, env or {}, source=None)

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
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

    def stream(self, name: str) -> StreamConfig:
        for stream in self.streams:
            if stream.name == name:
                return stream
        raise KeyError(f"unknown stream {name!r}; configured: {[s.name for s in self.streams]}")

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


def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> Config:
    """Load the YAML file at `path` (or nothing, if None) and apply `RSUB_*` overrides."""
    data: object = {}
    source = str(path) if path is not None else None
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError([f"<file>: cannot read: {exc.strerror or exc}"], source) from exc
        except UnicodeDecodeError as exc:
            problem = f"<file>: not UTF-8 text: byte {exc.object[exc.start]:#04x} at {exc.start}"
            raise ConfigError([problem], source) from exc
        except yaml.YAMLError as exc:
            raise ConfigError([f"<file>: not valid YAML: {_yaml_problem(exc)}"], source) from exc
        if data is None:
            data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            [f"<file>: top level must be a mapping, got {type(data).__name__}"], source
        )
    return _build(data, env, source)


# --- loader -----------------------------------------------------------------------------

_INVALID = object()


def _duplicates(items: typing.Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for item in items:
        if item in seen and item not in dups:
            dups.append(item)
        seen.add(item)
    return dups


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Collector:
    """Problems found so far, each as (key path, problem)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, problem: str) -> None:
        self.items.append((path, problem))


def _build(data: Mapping[str, Any], env: Mapping[str, str], source: str | None) -> Config:
    problems = _Collector()
    merged, env_paths = _apply_env(dict(data), env, problems)
    config = _convert(merged, Config, "", problems)
    if problems.items:
        raise ConfigError(
            [_render(path, problem, env_paths) for path, problem in problems.items], source
        )
    assert isinstance(config, Config)
    return config


def _render(path: str, problem: str, env_paths: Mapping[str, str]) -> str:
    for env_path, var in env_paths.items():
        if path == env_path or path.startswith((env_path + ".", env_path + "[")):
            return f"{path}: {problem} (from {var})"
    return f"{path or '<top level>'}: {problem}"


def _optional_inner(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _convert(value: object, tp: Any, path: str, problems: _Collector) -> Any:
    """Convert `value` to `tp`, recording problems under `path`; _INVALID on failure."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _convert(value, inner, path, problems)
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        return _convert_section(value, tp, path, problems)
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        problems.add(path, f"must be one of {', '.join(choices)}; got {value!r}")
        return _INVALID
    if origin is tuple:
        return _convert_list(value, typing.get_args(tp)[0], path, problems)
    if origin is Mapping:
        return _convert_map(value, typing.get_args(tp)[1], path, problems)
    return _convert_scalar(value, tp, path, problems)


def _convert_scalar(value: object, tp: Any, path: str, problems: _Collector) -> Any:
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:  # str, Path, Secret: all written as strings
        ok = isinstance(value, str)
    if ok:
        return float(value) if tp is float else tp(value)  # type: ignore[arg-type]
    expected = {bool: "a boolean", int: "an integer", float: "a number"}.get(tp, "a string")
    # Never echo what was given for a secret.
    shown = "" if tp is Secret else f" {value!r}"
    problems.add(path, f"expected {expected}, got {type(value).__name__}{shown}")
    return _INVALID


def _convert_list(value: object, item_tp: Any, path: str, problems: _Collector) -> Any:
    if not isinstance(value, list | tuple):
        problems.add(path, f"expected a list, got {type(value).__name__} {value!r}")
        return _INVALID
    items = [_convert(item, item_tp, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    return _INVALID if any(item is _INVALID for item in items) else tuple(items)


def _convert_map(value: object, value_tp: Any, path: str, problems: _Collector) -> Any:
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping, got {type(value).__name__} {value!r}")
        return _INVALID
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.add(path, f"keys must be strings, got {key!r}")
            continue
        out[key] = _convert(item, value_tp, _join(path, key), problems)
    if len(out) != len(value) or any(v is _INVALID for v in out.values()):
        return _INVALID
    return types.MappingProxyType(out)


def _convert_section(value: object, cls: type, path: str, problems: _Collector) -> Any:
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping, got {type(value).__name__}")
        return _INVALID
    before = len(problems.items)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.add(_join(path, str(key)), f"unknown key{hint}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key_path = _join(path, name)
        raw = value.get(name)
        if raw is None:
            if f.default is not dataclasses.MISSING:
                kwargs[name] = f.default  # absent or null: the default
            elif f.default_factory is not dataclasses.MISSING:
                kwargs[name] = f.default_factory()
            else:
                problems.add(
                    key_path, "missing required key" if name not in value else "must not be null"
                )
            continue
        converted = _convert(raw, hints[name], key_path, problems)
        if converted is _INVALID:
            continue
        check: Check | None = f.metadata.get("check")
        if check is not None and converted is not None and (problem := check(converted)):
            problems.add(key_path, problem)
            continue
        kwargs[name] = converted
    for key, problem in getattr(cls, "_check", _no_check)(kwargs):
        problems.add(_join(path, key), problem)
    return _INVALID if len(problems.items) > before else cls(**kwargs)


def _no_check(values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    return iter(())


# --- environment overrides ---------------------------------------------------------------

# What Kubernetes injects for every Service in the namespace ("service links"), the Service
# name upper-cased with '-' as '_': <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT,
# <SVC>_SERVICE_PORT_<PORT NAME>, <SVC>_PORT and <SVC>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR].
# A Service named `rsub` or `rsub-...` gives such RSUB_ variables. A Service name ends with a
# letter or digit, so a variable with `__` before its last word never has this shape.
_SERVICE_LINK_RE = re.compile(
    r"[A-Z](?:[A-Z0-9_]*[A-Z0-9])?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9]+(?:_[A-Z0-9]+)*)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)
# Similarity (difflib ratio, nesting ignored) from which an unknown variable counts as a typo
# of a setting: RSUB_REGOIN, RSUB_LOG_LVL and RSUB_NATS__SERVER are; RSUB_VERSION is not.
_TYPO_CUTOFF = 0.8

_EnvUse = Literal["setting", "service link", "unrelated"]


def _setting_paths(section: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The key path of every key an environment variable can set (sections are walked into)."""
    hints = typing.get_type_hints(section)
    for f in dataclasses.fields(section):
        tp = _optional_inner(hints[f.name]) or hints[f.name]
        if dataclasses.is_dataclass(tp):
            assert isinstance(tp, type)
            yield from _setting_paths(tp, (*prefix, f.name))
        else:
            yield (*prefix, f.name)


def _flat(name: str) -> str:
    """The words after the prefix, joined by one `_`: RSUB_LEASE__BUCKET -> lease_bucket."""
    return "_".join(word for word in name[len(ENV_PREFIX) :].lower().split("_") if word)


# Every setting's variable, by its flattened name.
_SETTING_VARS = {
    "_".join(path): ENV_PREFIX + "__".join(path).upper() for path in _setting_paths(Config)
}
_TOP_LEVEL_KEYS = frozenset(f.name for f in dataclasses.fields(Config))


def _did_you_mean(var: str) -> str | None:
    """The setting variable `var` most likely stands for: the same words nested otherwise
    (RSUB_LEASE_BUCKET), or a close spelling (RSUB_REGOIN); None if nothing is close."""
    close = difflib.get_close_matches(_flat(var), _SETTING_VARS, n=1, cutoff=_TYPO_CUTOFF)
    return _SETTING_VARS[close[0]] if close else None


def _env_use(var: str) -> _EnvUse:
    """How the loader treats an `RSUB_` variable (docs/configuration.md has the rule).

    "setting": meant to set a key (it names one, starts with a top-level key, or is a likely
    typo of a setting), so anything wrong with it is a configuration error; "service link":
    a Kubernetes service-link variable, ignored silently; "unrelated": ignored, and `rsub run`
    logs its name (never its value) at start.
    """
    if var in _SETTING_VARS.values():  # a setting wins even if a Service could make it
        return "setting"
    if _SERVICE_LINK_RE.fullmatch(var):
        return "service link"
    first = var[len(ENV_PREFIX) :].split("__")[0].lower()
    if first in _TOP_LEVEL_KEYS or _did_you_mean(var) is not None:
        return "setting"
    return "unrelated"


def unrelated_env(env: Mapping[str, str]) -> list[str]:
    """The names of the `RSUB_` variables in `env` that the loader ignores as unrelated."""
    return [
        var for var in sorted(env) if var.startswith(ENV_PREFIX) and _env_use(var) == "unrelated"
    ]


def _apply_env(
    data: dict[str, Any], env: Mapping[str, str], problems: _Collector
) -> tuple[dict[str, Any], dict[str, str]]:
    """Return `data` with the `RSUB_*` overrides applied, and {key path: variable}."""
    env_paths: dict[str, str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or _env_use(var) != "setting":
            continue
        keys = [part.lower() for part in var[len(ENV_PREFIX) :].split("__")]
        tp = _env_target(var, keys, problems)
        if tp is None:
            continue
        try:
            parsed = _parse_env_value(env[var], tp)
        except ValueError as exc:
            problems.add(".".join(keys), f"{exc} (from {var})")
            continue
        target = data
        for key in keys[:-1]:
            section = target.get(key)
            section = dict(section) if isinstance(section, Mapping) else {}
            target[key] = section
            target = section
        target[keys[-1]] = parsed
        env_paths[".".join(keys)] = var
    return data, env_paths


def _env_target(var: str, keys: list[str], problems: _Collector) -> Any | None:
    """The declared type at `keys`, or None after recording why the variable is unusable."""
    tp: Any = Config
    for depth, key in enumerate(keys):
        section: Any = _optional_inner(tp) or tp
        if not dataclasses.is_dataclass(section):
            problems.add(var, f"unknown setting: {'.'.join(keys[:depth])} has no sub-keys")
            return None
        if key not in {f.name for f in dataclasses.fields(section)}:
            close = _did_you_mean(var)
            hint = f" (did you mean {close}?)" if close else ""
            problems.add(var, f"unknown setting: no key {'.'.join(keys[: depth + 1])!r}{hint}")
            return None
        tp = typing.get_type_hints(section)[key]
    if dataclasses.is_dataclass(_optional_inner(tp) or tp):
        problems.add(var, f"{'.'.join(keys)} is a section; set its keys as {var}__<KEY>")
        return None
    return tp


def _parse_env_value(text: str, tp: Any) -> object:
    """Parse an environment string into the plain value the YAML would have held."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if text == "" else _parse_env_value(text, inner)
    origin = typing.get_origin(tp)
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item_tp):
            return _parse_yaml(text)
        items = [item.strip() for item in text.split(",")]
        if "" in items:
            raise ValueError(f"empty item in comma-separated list {text!r}")
        return [_parse_env_value(item, item_tp) for item in items]
    if origin is Mapping:
        return _parse_yaml(text)
    if tp is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected a boolean (true/false), got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    return text


def _parse_yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A one-line description of a YAML error (the default text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())
