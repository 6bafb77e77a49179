"""Fuzz targets: what the sidecar reads from others, and what each may answer.

Each target takes one input (bytes from the fuzzer) and raises `Escape` (or lets any other
exception out) when the code under test does anything but its documented answer:

- `markers`: `decode` a marker read from a read stream: a `Marker` or a `Rejected` naming
  its reason, never an exception. A decoded marker survives `check_writer` under any subject,
  encodes back to bytes that decode to the same marker, and has a message id.
- `origins`: the origin of a data message from its `Nats-Stream-Source` header
  (`data_entry`): an origin region of the virtual stream with a positive sequence, or
  `UNKNOWN_ORIGIN`; never an exception.
- `config`: a configuration file and `RSUB_*` overrides (`load_config`): a `Config` or a
  `ConfigError`; never another exception.
- `api`: a gRPC request, as bytes, to each method of the servicers, with an authorization
  header, over the in-memory backend: a response, or an abort with the status its
  `ApiError` maps to (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE,
  UNAUTHENTICATED, PERMISSION_DENIED); never INTERNAL (an unexpected exception) nor
  another exception. Bytes that are no request are refused by gRPC before the servicer
  runs (the message does not parse): such inputs are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from sidecar._gen.rsub.v1 import api_pb2, markers_pb2
from sidecar.api.grpc_server import _AdminService, _BearerTokenAuth, _CursorService
from sidecar.config.checks import ConfigError
from sidecar.config.loading import load_config
from sidecar.metrics import SidecarMetrics
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.origin_log import data_entry
from sidecar.protocol import (
    Marker,
    Rejected,
    check_writer,
    decode,
    encode,
    marker_msg_id,
)
from sidecar.protocol.origins import UNKNOWN_ORIGIN
from tests.support.api_fakes import MemoryBackend

REGIONS = ("west", "central", "east")
STREAM = "orders"
VS = VirtualStream(name=STREAM, regions=REGIONS)


class Escape(AssertionError):
    """The code under test answered something it documents it never answers."""


# ---- markers ------------------------------------------------------------------------------

# Input: one byte picking the subject the marker was stored under, then the marker's bytes.
SUBJECTS = tuple(
    [VS.marker_subject(r) for r in REGIONS]
    + [VS.snapshot_subject(r) for r in REGIONS]
    + ["", ".", "_rsub.orders.marker.", "_rsub.orders.marker.north"]
)


def markers(data: bytes) -> None:
    if not data:
        return
    subject = SUBJECTS[data[0] % len(SUBJECTS)]
    decoded = decode(data[1:], stream=STREAM, regions=REGIONS)
    if isinstance(decoded, Rejected):
        return
    if not isinstance(decoded, Marker):
        raise Escape(f"decode returned {decoded!r}")
    checked = check_writer(decoded, subject)
    if not isinstance(checked, Marker | Rejected):
        raise Escape(f"check_writer returned {checked!r}")
    again = decode(encode(decoded), stream=STREAM, regions=REGIONS)
    if again != decoded:
        raise Escape(f"{decoded!r} encoded and decoded again is {again!r}")
    if not marker_msg_id(decoded):
        raise Escape(f"no message id for {decoded!r}")


# ---- origins of data messages -----------------------------------------------------------------


def origins(data: bytes) -> None:
    """Input: the header's value (UTF-8, as nats-py hands headers on)."""
    header = data.decode("utf-8", "replace")
    read_seq = 1 + len(data)
    entry = data_entry(VS, read_seq, {SOURCE_HEADER: header})
    if entry.read_seq != read_seq:
        raise Escape(f"{entry!r} is not at read sequence {read_seq}")
    if entry.origin == UNKNOWN_ORIGIN:
        return
    if entry.origin not in REGIONS or entry.origin_seq <= 0:
        raise Escape(f"header {header!r} gave {entry!r}")


# ---- configuration --------------------------------------------------------------------------

ENV_SEPARATOR = b"\0\0"


class _ConfigFile:
    """One file rewritten for every input (in memory where /dev/shm exists)."""

    def __init__(self) -> None:
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, name = tempfile.mkstemp(prefix="rsub-fuzz-", suffix=".yaml", dir=where)
        os.close(fd)
        self.path = Path(name)

    def load(self, text: bytes, env: dict[str, str]) -> None:
        self.path.write_bytes(text)
        with contextlib.suppress(ConfigError):
            load_config(self.path, env)


_config_file: _ConfigFile | None = None


def config(data: bytes) -> None:
    """Input: `KEY=value` lines of environment, a double NUL, then the YAML file (with no
    double NUL, all of it is the file)."""
    global _config_file
    if _config_file is None:
        _config_file = _ConfigFile()
    env_part, separator, text = data.partition(ENV_SEPARATOR)
    if not separator:
        env_part, text = b"", data
    env = {}
    for line in env_part.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    _config_file.load(text, env)


# ---- gRPC requests --------------------------------------------------------------------------

TOKEN = "fuzz-token"
# What an `ApiError` or the token check may answer; INTERNAL means an unexpected exception.
ANSWERS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code


class _Context:
    """The part of `grpc.aio.ServicerContext` the handlers use: `abort` raises."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


class _Details:
    """The call details a server interceptor sees."""

    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


async def _through(_details: Any) -> None:
    return None  # the interceptor let the call through to the handler


SERVICES = ("CursorService", "AdminService")


def api_methods() -> list[tuple[str, str, type[Message]]]:
    """(service, method, request type) of every method of the two services, in a fixed order."""
    return [
        (service, method.name, getattr(api_pb2, method.input_type.name))
        for service in SERVICES
        for method in api_pb2.DESCRIPTOR.services_by_name[service].methods
    ]


class Api:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.backend = MemoryBackend()
        servicers = {
            "CursorService": _CursorService(self.backend, SidecarMetrics()),
            "AdminService": _AdminService(self.backend),
        }
        self.auth = _BearerTokenAuth(TOKEN)
        full_names = {s: api_pb2.DESCRIPTOR.services_by_name[s].full_name for s in SERVICES}
        self.methods = [
            (f"/{full_names[service]}/{method}", request_type, getattr(servicers[service], method))
            for service, method, request_type in api_methods()
        ]

    def call(self, method: int, request: bytes, authorization: str | None) -> str | None:
        """Call method number `method` with `request`: None when answered, else the name of
        the status it was refused with (`Escape` for a status no `ApiError` maps to)."""
        name, request_type, handler = self.methods[method % len(self.methods)]
        try:
            message = request_type.FromString(request)
        except DecodeError:
            return "DECODE"  # gRPC refuses it before any servicer runs
        try:
            self.loop.run_until_complete(self._call(name, handler, message, authorization))
        except Aborted as aborted:
            if aborted.code not in ANSWERS:
                raise Escape(f"{name}({message!r}) aborted with {aborted.args}") from aborted
            return str(aborted.code.name)
        return None

    async def _call(
        self, name: str, handler: Callable[..., Any], message: Message, authorization: str | None
    ) -> None:
        metadata = () if authorization is None else (("authorization", authorization),)
        rejecting = await self.auth.intercept_service(_through, _Details(name, metadata))
        if rejecting is not None:
            await rejecting.unary_unary(message, _Context())
        elif name.endswith("/WatchSubscription"):
            updates = handler(message, _Context())
            try:
                await anext(updates)  # the first answer; later ones wait for changes
            finally:
                await updates.aclose()
        else:
            await handler(message, _Context())


_api: Api | None = None


def api(data: bytes) -> None:
    """Input: a byte picking the method, a byte picking the authorization (none, the right
    token, or the next byte's count of bytes as the header), then the request's bytes."""
    global _api
    if _api is None:
        _api = Api()
    if len(data) < 2:
        return
    method, mode, rest = data[0], data[1] % 3, data[2:]
    authorization = None
    if mode == 1:
        authorization = f"Bearer {TOKEN}"
    elif mode == 2 and rest:
        size, rest = rest[0], rest[1:]
        authorization, rest = rest[:size].decode("utf-8", "replace"), rest[size:]
    _api.backend.is_leader = len(rest) % 2 == 0
    _api.backend.unavailable = len(rest) % 7 == 3
    _api.call(method, rest, authorization)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "markers": markers,
    "origins": origins,
    "config": config,
    "api": api,
}

# ---- a broken variant the fuzzer must catch ---------------------------------------------------


def markers_unguarded(data: bytes) -> None:
    """`markers` over a decoder that parses without catching the parser's errors: the first
    malformed input escapes (the runner's test shows that escapes are found and reported)."""
    markers_pb2.Marker.FromString(data[1:])
    markers(data)


BROKEN: dict[str, Callable[[bytes], None]] = {"markers-unguarded": markers_unguarded}
