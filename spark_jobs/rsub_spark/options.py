"""Options of the `rsub` Spark data source: parsing and validation, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sidecar.config.checks import ConfigError
from sidecar.config.nats import NatsConfig, nats_settings, renamed
from sidecar.config.secrets import Secret, repr_hiding_userinfo
from sidecar.naming import (
    DEFAULT_READ_STREAM,
    DEFAULT_WRITE_STREAM,
    NamingError,
    VirtualStream,
    check_token,
)

# Stands in for the region when only readStream is given, to validate writeStreamPattern.
_SAMPLE_REGION = "region"

# Spark lower-cases option names; the canonical spelling is kept for messages and docs.
KNOWN_OPTIONS: dict[str, str] = {
    name.lower(): name
    for name in (
        "servers",
        "stream",
        "region",
        "readStream",
        "readStreamPattern",
        "writeStreamPattern",
        "subscription",
        "sidecar",
        "sidecarToken",
        "sidecarTlsCa",
        "sidecarTlsCert",
        "sidecarTlsKey",
        "startingOffsets",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "minPartitions",
        "maxRecordsPerPartition",
        "includeHeaders",
        "failOnDataLoss",
        "latestOffsetCacheMs",
        "timeoutMs",
        "user",
        "password",
        "token",
        "credsFile",
        "tlsCa",
        "tlsCert",
        "tlsKey",
    )
}


# The option that sets each key of the NATS settings (`NatsConfig`), for its problems.
NATS_OPTIONS = {
    "servers": "option servers",
    "user": "option user",
    "password": "option password",
    "token": "option token",
    "creds_file": "option credsFile",
    "tls.ca_file": "option tlsCa",
    "tls.cert_file": "option tlsCert",
    "tls.key_file": "option tlsKey",
    "connect_timeout_s": "option timeoutMs",
    "tls": "options tlsCa/tlsCert/tlsKey",
}


class RsubOptionError(ValueError):
    """An option of the rsub source is missing, unknown or malformed."""


StartKind = Literal["earliest", "latest", "subscription", "sequence"]


@dataclass(frozen=True)
class StartingOffsets:
    kind: StartKind
    # For kind "sequence": the first read-stream sequence to read (inclusive).
    sequence: int = 0


@dataclass(frozen=True)
class EndingOffsets:
    kind: Literal["latest", "sequence"]
    # For kind "sequence": the last read-stream sequence to read (inclusive).
    sequence: int = 0


@dataclass(frozen=True)
class RsubOptions:
    stream: str
    read_stream: str
    # The virtual stream's write-stream pattern: reads the origin region of each row.
    write_stream_pattern: str
    region: str | None
    subscription: str | None
    sidecar: str | None
    sidecar_token: Secret | None
    # Files on the driver for a TLS channel to the sidecar (none: plaintext).
    sidecar_tls_ca: Path | None
    sidecar_tls_cert: Path | None
    sidecar_tls_key: Path | None
    starting: StartingOffsets | None
    ending: EndingOffsets
    max_offsets_per_trigger: int | None
    min_partitions: int
    max_records_per_partition: int
    include_headers: bool
    fail_on_data_loss: bool
    latest_offset_cache_ms: int
    timeout_ms: int
    nats: NatsConfig
    """How to connect (`servers`, `user`, `password`, `token`, `credsFile`, `tlsCa`,
    `tlsCert`, `tlsKey`, `timeoutMs`): files on the driver and on every executor."""

    __repr__ = repr_hiding_userinfo

    @property
    def data_filter(self) -> str:
        """The subject filter that selects data and never a marker."""
        return f"{self.stream}.>"

    def starting_for(self, streaming: bool) -> StartingOffsets:
        """The starting position, defaulted like Spark's Kafka source (and the subscription)."""
        if self.starting is not None:
            return self.starting
        if self.subscription is not None and self.sidecar is not None:
            return StartingOffsets("subscription")
        return StartingOffsets("latest" if streaming else "earliest")


def _secret(value: str | None) -> Secret | None:
    """Credentials stay wrapped: a repr of the options (a traceback, a log) never shows them."""
    return Secret(value) if value is not None else None


def _canonical(key: str) -> str:
    return KNOWN_OPTIONS.get(key.lower(), key)


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise RsubOptionError(f"option {name}: expected true or false, got {value!r}")


def _parse_int(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise RsubOptionError(f"option {name}: expected an integer, got {value!r}") from None
    if number < minimum:
        raise RsubOptionError(f"option {name}: must be >= {minimum}, got {number}")
    return number


def _parse_sequence_json(name: str, value: str) -> int:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if (
        not isinstance(parsed, dict)
        or set(parsed) != {"sequence"}
        or not isinstance(parsed["sequence"], int)
        or isinstance(parsed["sequence"], bool)
        or parsed["sequence"] < 1
    ):
        raise RsubOptionError(
            f"option {name}: expected earliest, latest, subscription or a JSON object like "
            f'{{"sequence": 1234}} with a sequence >= 1, got {value!r}'
        )
    sequence: int = parsed["sequence"]
    return sequence


def _parse_starting(value: str) -> StartingOffsets:
    lowered = value.strip().lower()
    if lowered in ("earliest", "latest", "subscription"):
        return StartingOffsets(lowered)  # type: ignore[arg-type]
    return StartingOffsets("sequence", _parse_sequence_json("startingOffsets", value))


def _parse_ending(value: str) -> EndingOffsets:
    if value.strip().lower() == "latest":
        return EndingOffsets("latest")
    try:
        return EndingOffsets("sequence", _parse_sequence_json("endingOffsets", value))
    except RsubOptionError:
        raise RsubOptionError(
            f'option endingOffsets: expected latest or a JSON object like {{"sequence": 1234}}, '
            f"got {value!r}"
        ) from None


def _check_name(option: str, value: str) -> str:
    try:
        return check_token(option, value)
    except NamingError as exc:
        raise RsubOptionError(f"option {exc}") from None


def _path(given: Mapping[str, str], name: str) -> Path | None:
    value = given.get(name, "").strip()
    return Path(value) if value else None


def parse_options(raw: Mapping[str, str]) -> RsubOptions:
    """Validates the options of one `rsub` read; raises RsubOptionError naming the option."""
    given: dict[str, str] = {}
    for key, value in raw.items():
        canonical = _canonical(key)
        if canonical.lower() not in KNOWN_OPTIONS:
            known = ", ".join(sorted(KNOWN_OPTIONS.values()))
            raise RsubOptionError(f"unknown option {key!r} for the rsub source (known: {known})")
        given[canonical] = str(value)

    def required(name: str) -> str:
        value = given.get(name, "").strip()
        if not value:
            raise RsubOptionError(f"option {name} is required")
        return value

    servers = tuple(s.strip() for s in required("servers").split(",") if s.strip())
    stream = _check_name("stream", required("stream"))
    region = given.get("region", "").strip() or None
    if region is not None:
        _check_name("region", region)
    write_pattern = given.get("writeStreamPattern", "").strip() or DEFAULT_WRITE_STREAM
    read_pattern = given.get("readStreamPattern", "").strip() or DEFAULT_READ_STREAM
    try:
        virtual = VirtualStream(
            stream,
            (region or _SAMPLE_REGION,),
            write_pattern=write_pattern,
            read_pattern=read_pattern,
        )
    except NamingError as exc:
        # Name and region are valid tokens by now: the contract refused a pattern, and its
        # message starts with which. The default read pattern is only ever refused for
        # colliding with the write pattern the user gave.
        at_fault = str(exc).partition(":")[0]
        option = (
            "readStreamPattern"
            if at_fault == "read_pattern" and "readStreamPattern" in given
            else "writeStreamPattern"
        )
        raise RsubOptionError(f"option {option}: {exc}") from None
    read_stream = given.get("readStream", "").strip()
    if read_stream and "readStreamPattern" in given:
        raise RsubOptionError("options readStream and readStreamPattern exclude each other")
    if not read_stream:
        if region is None:
            raise RsubOptionError("option region is required unless readStream names the stream")
        read_stream = virtual.read_stream(region)
    _check_name("readStream", read_stream)

    starting = _parse_starting(given["startingOffsets"]) if "startingOffsets" in given else None
    subscription = given.get("subscription", "").strip() or None
    sidecar = given.get("sidecar", "").strip() or None
    if (
        starting is not None
        and starting.kind == "subscription"
        and (subscription is None or sidecar is None)
    ):
        raise RsubOptionError(
            "option startingOffsets=subscription needs the options subscription and sidecar"
        )
    if subscription is not None:
        _check_name("subscription", subscription)

    max_per_trigger = (
        _parse_int("maxOffsetsPerTrigger", given["maxOffsetsPerTrigger"], 1)
        if "maxOffsetsPerTrigger" in given
        else None
    )
    timeout_ms = _parse_int("timeoutMs", given.get("timeoutMs", "10000"), 1)
    try:
        nats = nats_settings(
            servers,
            user=given.get("user"),
            password=_secret(given.get("password")),
            token=_secret(given.get("token")),
            creds_file=_path(given, "credsFile"),
            ca_file=_path(given, "tlsCa"),
            cert_file=_path(given, "tlsCert"),
            key_file=_path(given, "tlsKey"),
            connect_timeout_s=timeout_ms / 1000,
        )
    except ConfigError as exc:
        raise RsubOptionError(renamed(exc, NATS_OPTIONS)) from None
    return RsubOptions(
        stream=stream,
        read_stream=read_stream,
        write_stream_pattern=write_pattern,
        region=region,
        subscription=subscription,
        sidecar=sidecar,
        sidecar_token=_secret(given.get("sidecarToken")),
        sidecar_tls_ca=_path(given, "sidecarTlsCa"),
        sidecar_tls_cert=_path(given, "sidecarTlsCert"),
        sidecar_tls_key=_path(given, "sidecarTlsKey"),
        starting=starting,
        ending=_parse_ending(given.get("endingOffsets", "latest")),
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=_parse_int("minPartitions", given.get("minPartitions", "1"), 1),
        max_records_per_partition=_parse_int(
            "maxRecordsPerPartition", given.get("maxRecordsPerPartition", "50000"), 1
        ),
        include_headers=_parse_bool("includeHeaders", given.get("includeHeaders", "false")),
        fail_on_data_loss=_parse_bool("failOnDataLoss", given.get("failOnDataLoss", "true")),
        latest_offset_cache_ms=_parse_int(
            "latestOffsetCacheMs", given.get("latestOffsetCacheMs", "250"), 0
        ),
        timeout_ms=timeout_ms,
        nats=nats,
    )
