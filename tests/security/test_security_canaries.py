"""No secret in anything rsub prints, looked for the way an attacker would (issue 11).

Unique canary secrets go where an operator puts them: a NATS password in the YAML file, in
`RSUB_NATS__PASSWORD` or in a server URL's user info, an nkey seed in a creds file, passwords
and tokens in `rsub topology apply`'s flags and variables, gRPC bearer tokens on both sides,
the Spark source's password, token and sidecarToken options. `rsub run`, `rsub topology
apply`, `rsub status`/`subscriptions` and the Spark source's NATS and sidecar clients then go
through unreachable and refusing servers, a NATS restart, a crash at start and bad
configurations, logging at debug level in JSON and console form. Everything they print or
answer is kept (stdout, stderr, /metrics, /readyz, /healthz, gRPC answers and error details,
exception messages and formatted tracebacks, structlog events, stdlib log records) and
searched: no canary, no piece of its random tail and no URL user info may show anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import structlog

from rsub_dev.ports import HOST, free_ports, refusing_socket
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.client import call_metadata
from sidecar.api.service import Service
from sidecar.config.loading import config_from_mapping
from spark_jobs.rsub_spark.cursor import sidecar_client
from spark_jobs.rsub_spark.nats_read import NatsSession, stream_bounds
from spark_jobs.rsub_spark.options import parse_options
from tests.support.nats_jwt import operator_setup, write_creds
from tests.support.nats_servers import LoneServer, password_users
from tests.support.rsub_process import ready, rsub_command, run_rsub, write_sidecar_config

pytestmark = pytest.mark.integration

# Nothing the test does not set itself: no RSUB_ setting, no NATS_PASSWORD or NATS_TOKEN.
_CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("RSUB_") and k not in ("NATS_PASSWORD", "NATS_TOKEN")
}
# A URL's user info, unless masked as `***@`.
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?!\*\*\*@)[^\s/@'\"]+@")
_FORMATS = ("json", "console")
Metadata = tuple[tuple[str, str], ...]


def canary(kind: str) -> str:
    """A secret nothing prints by chance: `canary-<kind>-<32 hex digits>`."""
    return f"canary-{kind}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Secrets:
    """This test's secrets; `seed` is the nkey seed of `creds_file` (a user no server trusts)."""

    creds_file: Path
    seed: str
    password: str = field(default_factory=lambda: canary("pw"))
    wrong_password: str = field(default_factory=lambda: canary("wrong-pw"))
    nats_token: str = field(default_factory=lambda: canary("nats-token"))
    grpc_token: str = field(default_factory=lambda: canary("grpc-token"))
    client_token: str = field(default_factory=lambda: canary("client-token"))
    sidecar_token: str = field(default_factory=lambda: canary("sidecar-token"))

    def all(self) -> list[str]:
        return [v for v in vars(self).values() if isinstance(v, str)]


@pytest.fixture
def secrets(tmp_path: Path) -> Secrets:
    text = operator_setup().user_creds("rsub-sidecar")
    seed = re.search(r"-----BEGIN USER NKEY SEED-----\n(\S+)\n", text)
    assert seed is not None
    return Secrets(creds_file=write_creds(tmp_path / "user.creds", text), seed=seed[1])


@dataclass
class Transcript:
    """Everything the programs under test printed or answered, by where it was seen."""

    parts: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, text: str | bytes) -> None:
        self.parts.append(
            (where, text.decode(errors="replace") if isinstance(text, bytes) else text)
        )

    def add_error(self, where: str, error: BaseException) -> None:
        """An exception as a program shows it: message, repr and formatted traceback."""
        self.add(f"{where} str", str(error))
        self.add(f"{where} repr", repr(error))
        self.add(f"{where} traceback", "".join(traceback.format_exception(error)))

    def assert_no_secret(self, secrets: Sequence[str]) -> None:
        # A secret cut short or quoted otherwise still shows pieces of its random tail.
        needles = {piece for s in secrets for piece in (s, s[-12:], s[-24:-12])}
        leaks = []
        for where, text in self.parts:
            for needle in needles:
                at = text.find(needle)
                if at >= 0:
                    leaks.append(f"{where}: ...{text[max(0, at - 150) : at + 60]}...")
            if (found := _USERINFO.search(text)) is not None:
                leaks.append(f"{where}: URL user info {found[0]!r}")
        assert self.parts, "nothing was collected"
        assert not leaks, "\n".join(leaks)


def started_server(directory: Path, extra: Mapping[str, Any]) -> LoneServer:
    directory.mkdir()
    server = LoneServer(directory, extra)
    server.start()
    return server


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


# --- rsub run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where `rsub run` is given its NATS secret: a `nats` section and environment variables."""

    name: str
    nats: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def placements(secrets: Secrets, port: int, password: str) -> list[Placement]:
    """`password` in the YAML file, in RSUB_NATS__PASSWORD and in the server URL, then the
    creds file, for a server on `port`."""
    url = f"nats://{HOST}:{port}"
    return [
        Placement("yaml", {"servers": [url], "user": "svc", "password": password}),
        Placement("env", {"servers": [url], "user": "svc"}, {"RSUB_NATS__PASSWORD": password}),
        Placement("url", {"servers": [f"nats://svc:{password}@{HOST}:{port}"]}),
        Placement("creds", {"servers": [url], "creds_file": str(secrets.creds_file)}),
    ]


async def _keep(stream: asyncio.StreamReader | None, into: bytearray) -> None:
    assert stream is not None
    while chunk := await stream.read(65536):
        into.extend(chunk)


@dataclass
class Sidecar:
    """A running `rsub run`; its stdout and stderr are read as they come (debug logs would
    fill a pipe) and kept."""

    name: str
    proc: asyncio.subprocess.Process
    http_port: int
    grpc_port: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def readyz(self) -> str:
        return f"http://{HOST}:{self.http_port}/readyz"

    async def is_ready(self, expected: bool = True) -> bool:
        return await ready(self.readyz) == expected

    async def exited(self, timeout_s: float = 30) -> int:
        """The exit code, once the process ended (within `timeout_s`) and its output is read."""
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        await asyncio.gather(*self.readers)
        return code

    async def stop(self) -> int:
        """SIGTERM, then the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return await self.exited()

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        for task in self.readers:
            task.cancel()

    def record(self, transcript: Transcript) -> None:
        transcript.add(f"{self.name} stdout", bytes(self.out))
        transcript.add(f"{self.name} stderr", bytes(self.err))


async def start_sidecar(
    directory: Path,
    placement: Placement,
    log_format: str,
    secrets: Secrets,
    *,
    region: str = "west",
    grpc_port: int | None = None,
) -> Sidecar:
    """`rsub run` (debug logs) with the placement's secret and `grpc_token` required."""
    name = f"{region}-{placement.name}-{log_format}"
    where = directory / name
    where.mkdir(parents=True)
    grpc_port = grpc_port or free_ports(1)[0]
    overrides = {
        "region": region,
        "grpc": {"listen": f"{HOST}:{grpc_port}", "auth_token": secrets.grpc_token},
        "log": {"format": log_format, "level": "debug"},
    }
    config, http_port = write_sidecar_config(where, placement.nats, overrides)
    proc = await run_rsub("--config", str(config), env={**_CLEAN_ENV, **placement.env})
    sidecar = Sidecar(name, proc, http_port, grpc_port)
    sidecar.readers = [
        asyncio.create_task(_keep(proc.stdout, sidecar.out)),
        asyncio.create_task(_keep(proc.stderr, sidecar.err)),
    ]
    return sidecar


async def probe_api(
    sidecar: Sidecar, secrets: Secrets, transcript: Transcript
) -> dict[tuple[str, str], grpc.StatusCode]:
    """Reads /metrics, /readyz and /healthz, and calls Status and ListSubscriptions with no
    token, a wrong one and the right one; keeps every answer and error, returns the codes."""

    async def http_up() -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as http, http.get(sidecar.readyz):
                return True
        return False

    await eventually(http_up, f"{sidecar.name} serving HTTP", 30)
    async with aiohttp.ClientSession() as http:
        for path in ("/metrics", "/readyz", "/healthz"):
            async with http.get(f"http://{HOST}:{sidecar.http_port}{path}") as response:
                transcript.add(f"{sidecar.name} {path}", await response.text())
    codes: dict[tuple[str, str], grpc.StatusCode] = {}
    async with grpc.aio.insecure_channel(f"{HOST}:{sidecar.grpc_port}") as channel:
        admin = api_pb2_grpc.AdminServiceStub(channel)
        cursor = api_pb2_grpc.CursorServiceStub(channel)
        calls: dict[str, Callable[[Metadata], Awaitable[Any]]] = {
            "Status": lambda metadata: admin.Status(
                api_pb2.StatusRequest(), metadata=metadata, timeout=5
            ),
            "ListSubscriptions": lambda metadata: cursor.ListSubscriptions(
                api_pb2.ListSubscriptionsRequest(stream="orders"), metadata=metadata, timeout=5
            ),
        }
        tokens = {"none": None, "wrong": secrets.client_token, "right": secrets.grpc_token}
        for who, token in tokens.items():
            for method, call in calls.items():
                where = f"{sidecar.name} {method} with {who} token"
                try:
                    transcript.add(where, str(await call(call_metadata(token))))
                    codes[method, who] = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as error:
                    transcript.add(where, f"{error.details()} {error.debug_error_string()}")
                    transcript.add(where, f"{error.trailing_metadata()} {error!r}")
                    codes[method, who] = error.code()
    return codes


def assert_token_checked(codes: Mapping[tuple[str, str], grpc.StatusCode]) -> None:
    """The calls reached the token check: Status (admin) needs the right token."""
    assert codes["Status", "none"] == grpc.StatusCode.UNAUTHENTICATED, codes
    assert codes["Status", "wrong"] == grpc.StatusCode.PERMISSION_DENIED
    assert codes["Status", "right"] == grpc.StatusCode.OK


async def test_run_with_nats_unreachable(tmp_path: Path, secrets: Secrets) -> None:
    """Each placement, JSON and console: the reconnect loop for a few seconds, the API asked
    with wrong and right tokens meanwhile, then SIGTERM."""
    closed = refusing_socket()
    port = closed.getsockname()[1]
    transcript = Transcript()
    sidecars = [
        await start_sidecar(tmp_path, placement, log_format, secrets)
        for placement in placements(secrets, port, secrets.password)
        for log_format in _FORMATS
    ]
    try:
        for codes in await asyncio.gather(*(probe_api(s, secrets, transcript) for s in sidecars)):
            assert_token_checked(codes)
        await asyncio.sleep(3)  # a few reconnect attempts
        assert await asyncio.gather(*(s.stop() for s in sidecars)) == [0] * len(sidecars)
    finally:
        closed.close()
        for sidecar in sidecars:
            await sidecar.close()
    for sidecar in sidecars:
        sidecar.record(transcript)
        # The refusal, as uvloop (the sidecar's event loop) words it.
        assert b"nats_error" in sidecar.out and b"Connection refused" in sidecar.out
    transcript.assert_no_secret(secrets.all())


async def test_run_refused_by_nats(tmp_path: Path, secrets: Secrets) -> None:
    """Each placement, JSON and console, against a server refusing it: exit 3."""
    server = started_server(tmp_path / "nats", password_users(("svc", "the-right-one")))
    transcript = Transcript()
    sidecars = [
        await start_sidecar(tmp_path, placement, log_format, secrets)
        for placement in placements(secrets, server.port, secrets.password)
        for log_format in _FORMATS
    ]
    try:
        assert await asyncio.gather(*(s.exited() for s in sidecars)) == [3] * len(sidecars)
    finally:
        server.stop()
        for sidecar in sidecars:
            await sidecar.close()
    for sidecar in sidecars:
        sidecar.record(transcript)
        assert sidecar.err.startswith(b"rsub run: NATS refused the connection"), sidecar.err
    assert server.log_text().count("authentication error") >= len(sidecars)
    transcript.assert_no_secret(secrets.all())


async def test_run_ready_through_a_nats_restart(tmp_path: Path, secrets: Secrets) -> None:
    """Sidecars accepted by NATS: the API and the remote commands asked with wrong and right
    tokens, NATS killed (disconnects, failed reconnects) and started again (reconnects)."""
    # A server each: on a lone server, a second sidecar finds the streams unplaced.
    servers = [
        started_server(tmp_path / f"nats-{i}", password_users(("svc", secrets.password)))
        for i in range(3)
    ]
    transcript = Transcript()
    sidecars = []
    closed = refusing_socket()
    try:
        for server, (placement, log_format) in zip(
            servers, (("url", "json"), ("env", "console"), ("yaml", "console")), strict=True
        ):
            [chosen] = [
                p for p in placements(secrets, server.port, secrets.password) if p.name == placement
            ]
            sidecars.append(await start_sidecar(tmp_path, chosen, log_format, secrets))
        for sidecar in sidecars:
            await eventually(sidecar.is_ready, f"{sidecar.name} ready", 60)
            assert_token_checked(await probe_api(sidecar, secrets, transcript))
        address = f"{HOST}:{sidecars[0].grpc_port}"
        nowhere = f"{HOST}:{closed.getsockname()[1]}"
        commands = {
            ("status", "--sidecar", address, "--token", secrets.client_token): 1,
            ("status", "--sidecar", address, "--token", secrets.grpc_token): 0,
            ("subscriptions", "orders", "--sidecar", address, "--token", secrets.client_token): 0,
            ("status", "--sidecar", nowhere, "--token", secrets.client_token): 2,
            ("subscriptions", "orders", "--json", "--sidecar", nowhere): 2,
        }
        for argv, expected in commands.items():
            # The last one takes its token from RSUB_TOKEN.
            code, out, err = await rsub_command(
                *argv, env={**_CLEAN_ENV, "RSUB_TOKEN": secrets.client_token}
            )
            transcript.add(f"rsub {' '.join(argv[:2])} stdout", out)
            transcript.add(f"rsub {' '.join(argv[:2])} stderr", err)
            assert code == expected, (argv, out, err)
        for server in servers:
            server.stop()
        for sidecar in sidecars:
            await eventually(partial(sidecar.is_ready, False), "disconnected", 30)
        await asyncio.sleep(2)  # failed reconnects
        for server in servers:
            server.start()
        for sidecar in sidecars:
            await eventually(sidecar.is_ready, f"{sidecar.name} back", 60)
        assert await asyncio.gather(*(s.stop() for s in sidecars)) == [0] * len(sidecars)
    finally:
        closed.close()
        for server in servers:
            server.stop()
        for sidecar in sidecars:
            await sidecar.close()
    for sidecar in sidecars:
        sidecar.record(transcript)
        for event in (b"nats_connected", b"nats_disconnected", b"nats_reconnected"):
            assert event in sidecar.out, (sidecar.name, event)
    transcript.assert_no_secret(secrets.all())


async def test_run_crashing_at_start(tmp_path: Path, secrets: Secrets) -> None:
    """The gRPC port is taken: `rsub run` exits 2 at start, saying so on stderr without a
    traceback (JSON and console)."""
    taken = socket.socket()
    taken.bind((HOST, 0))
    taken.listen()
    url = placements(secrets, 4222, secrets.password)[2]
    transcript = Transcript()
    sidecars = [
        await start_sidecar(tmp_path, url, log_format, secrets, grpc_port=taken.getsockname()[1])
        for log_format in _FORMATS
    ]
    try:
        assert await asyncio.gather(*(s.exited() for s in sidecars)) == [2] * len(sidecars)
    finally:
        taken.close()
        for sidecar in sidecars:
            await sidecar.close()
    for sidecar in sidecars:
        sidecar.record(transcript)
        assert b"Traceback" not in sidecar.err and b"gRPC server cannot listen" in sidecar.err
    transcript.assert_no_secret(secrets.all())


async def test_run_refusing_a_bad_configuration(tmp_path: Path, secrets: Secrets) -> None:
    """Configurations that hold secrets and are wrong around them: exit 2, never echoed."""
    pw = secrets.password
    cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("bad-port", {"servers": [f"nats://svc:{pw}@{HOST}:42x"]}, {}),
        ("not-a-list", {"servers": f"nats://svc:{pw}@{HOST}:4222"}, {}),
        ("no-scheme", {"servers": [f"svc:{pw}@{HOST}:4222"]}, {}),
        ("empty-item", {}, {"RSUB_NATS__SERVERS": f"nats://svc:{pw}@{HOST}:4222,"}),
        ("env-list", {}, {"RSUB_NATS__SERVERS": f"[nats://svc:{pw}@{HOST}:4222]"}),
        (
            "two-methods",
            {"servers": [f"nats://{HOST}:4222"], "user": "svc", "password": pw},
            {"RSUB_NATS__TOKEN": secrets.nats_token},
        ),
        (
            "password-list",
            {"servers": [f"nats://{HOST}:4222"], "user": "svc", "password": [pw]},
            {},
        ),
    ]
    transcript = Transcript()
    for name, nats, env in cases:
        (tmp_path / name).mkdir()
        config, _ = write_sidecar_config(tmp_path / name, nats)
        code, out, err = await rsub_command(
            "run", "--config", str(config), env={**_CLEAN_ENV, **env}
        )
        transcript.add(f"{name} stdout", out)
        transcript.add(f"{name} stderr", err)
        assert code == 2 and "invalid configuration" in err, (name, err)
    transcript.assert_no_secret(secrets.all())


# --- rsub topology apply -----------------------------------------------------------------


async def test_topology_apply_unreachable_and_refused(tmp_path: Path, secrets: Secrets) -> None:
    """`rsub topology apply --dry-run` with secrets in URLs, flags and variables, against
    nothing listening and against a server refusing them: exit 1, saying why (a URL without
    a scheme is refused before connecting, as the sidecar's configuration refuses it: exit 2)."""
    server = started_server(tmp_path / "nats", password_users(("svc", "the-right-one")))
    closed = refusing_socket()
    nowhere = f"{HOST}:{closed.getsockname()[1]}"
    pw = secrets.password
    cases: list[tuple[str, list[str], dict[str, str], str]] = [
        ("url", ["--servers", f"nats://u:{pw}@{nowhere}"], {}, "cannot reach NATS"),
        ("bare url", ["--servers", f"u:{pw}@{nowhere}"], {}, "invalid server URL"),
        ("env", ["--servers", f"nats://{nowhere}", "--user", "u"], {"NATS_PASSWORD": pw}, "reach"),
        ("token", ["--servers", f"nats://{nowhere}"], {"NATS_TOKEN": secrets.nats_token}, "reach"),
        ("url", ["--servers", f"nats://svc:{pw}@{HOST}:{server.port}"], {}, "refused"),
        ("env", ["--servers", server.url, "--user", "svc"], {"NATS_PASSWORD": pw}, "refused"),
        ("flag", ["--servers", server.url, "--user", "svc", "--password", pw], {}, "refused"),
        ("token", ["--servers", server.url], {"NATS_TOKEN": secrets.nats_token}, "refused"),
        ("creds", ["--servers", server.url, "--creds", str(secrets.creds_file)], {}, "refused"),
    ]
    argv = ["topology", "apply", "--regions", "west,east", "--stream", "orders", "--dry-run"]
    try:
        results = await asyncio.gather(
            *(rsub_command(*argv, *flags, env={**_CLEAN_ENV, **env}) for _, flags, env, _ in cases)
        )
    finally:
        closed.close()
        server.stop()
    transcript = Transcript()
    for (name, _, _, says), (code, out, err) in zip(cases, results, strict=True):
        transcript.add(f"{name} {says} stdout", out)
        transcript.add(f"{name} {says} stderr", err)
        assert code == (2 if name == "bare url" else 1) and says in err, (name, err)
    transcript.assert_no_secret(secrets.all())


# --- the Spark source --------------------------------------------------------------------


async def test_spark_source_clients(
    tmp_path: Path, secrets: Secrets, caplog: pytest.LogCaptureFixture
) -> None:
    """The source's NATS session and sidecar client with canary password, token and
    sidecarToken: nothing listening, a refusing NATS, a missing stream, a sidecar that wants
    another token."""
    caplog.set_level(logging.DEBUG)
    server = started_server(tmp_path / "nats", password_users(("spark", secrets.password)))
    closed = refusing_socket()
    nowhere = f"{HOST}:{closed.getsockname()[1]}"
    sidecar = Service(
        config_from_mapping(
            {
                "region": "west",
                "regions": ["west", "east"],
                "streams": [{"name": "orders"}],
                "nats": {"servers": [f"nats://{nowhere}"]},
                "grpc": {"listen": f"{HOST}:0", "auth_token": secrets.grpc_token},
                "http": {"listen": f"{HOST}:0"},
            }
        )
    )

    def options(servers: str, sidecar_at: str, **auth: str) -> Any:
        return parse_options(
            {
                "servers": servers,
                "stream": "orders",
                "region": "west",
                "timeoutMs": "2000",
                "sidecar": sidecar_at,
                "sidecarToken": secrets.sidecar_token,
                "subscription": "billing",
                "startingOffsets": "subscription",
                **auth,
            }
        )

    def read_bounds(opts: Any) -> None:
        session = NatsSession(opts)
        try:
            session.run(lambda nc: stream_bounds(nc, opts))
        finally:
            session.close()

    def ask_sidecar(opts: Any) -> None:
        client = sidecar_client(opts)
        try:
            client.subscription(opts.stream, "billing")
        finally:
            client.close()

    def commit(opts: Any) -> None:
        client = sidecar_client(opts)
        try:
            client.commit_with_retries(opts.stream, "billing", 7, attempts=2, backoff_s=0.05)
        finally:
            client.close()

    transcript = Transcript()
    await sidecar.start()
    try:
        at = f"{HOST}:{sidecar.grpc_port}"
        wrong = {"user": "spark", "password": secrets.wrong_password}
        right_url = f"nats://spark:{secrets.password}@{HOST}:{server.port}"
        cases: list[tuple[str, Callable[[Any], None], Any, str]] = [
            (
                "url, nothing",
                read_bounds,
                options(f"nats://spark:{secrets.password}@{nowhere}", at),
                "cannot reach NATS",
            ),
            (
                "user, nothing",
                read_bounds,
                options(f"nats://{nowhere}", at, **wrong),
                "cannot reach NATS",
            ),
            (
                "token, nothing",
                read_bounds,
                options(f"nats://{nowhere}", at, token=secrets.nats_token),
                "cannot reach NATS",
            ),
            (
                "url, refused",
                read_bounds,
                options(f"nats://spark:{secrets.wrong_password}@{HOST}:{server.port}", at),
                "NATS refused the connection",
            ),
            (
                "user, refused",
                read_bounds,
                options(server.url, at, **wrong),
                "NATS refused the connection",
            ),
            (
                "token, refused",
                read_bounds,
                options(server.url, at, token=secrets.nats_token),
                "NATS refused the connection",
            ),
            ("url, no stream", read_bounds, options(right_url, at), "not found"),
            ("sidecar nothing", ask_sidecar, options(server.url, nowhere), "unreachable"),
            ("commit nothing", commit, options(server.url, nowhere), "UNAVAILABLE"),
            ("sidecar wrong token", commit, options(server.url, at), "PERMISSION_DENIED"),
        ]
        with structlog.testing.capture_logs() as events:
            for name, call, opts, says in cases:
                with pytest.raises(Exception) as raised:
                    await asyncio.to_thread(call, opts)
                transcript.add_error(name, raised.value)
                assert says in str(raised.value), (name, raised.value)
    finally:
        await sidecar.stop()
        closed.close()
        server.stop()
    transcript.add("structlog events", "\n".join(map(str, events)))
    transcript.add("stdlib log records", caplog.text)
    assert any(e["event"] == "rsub.cursor_commit_failed" for e in events)
    transcript.assert_no_secret(secrets.all())
