"""Every NATS authentication mode the configuration offers, against a real nats-server.

Each mode: a server configured for it, a `Config` built with `config_from_mapping`, a
connection through `sidecar.nats.connection.NatsConnection`, and a JetStream round trip
(create a stream, publish, read the stream state). Wrong credentials must give a clear,
one-line warning naming the cause, never a traceback, and never a connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.nats.connection import NatsConnection
from tests.support.api_fakes import Certs
from tests.support.nats_jwt import operator_setup, write_creds
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

_FAIL_BUDGET_S = 3.0


@dataclass(frozen=True)
class AuthCase:
    """One mode: the server's settings, good and bad client settings, the expected error."""

    server: dict[str, Any]
    good: dict[str, Any]
    bad: dict[str, Any]
    error: str
    # What the server logs when it refuses the bad settings.
    refused: str = "authentication error"
    scheme: str = "nats"


def _user_password(tmp: Path, certs: Certs) -> AuthCase:
    users = [{"user": "rsub", "password": "s3cret-pw"}]
    return AuthCase(
        server={"authorization": {"users": users}},
        good={"user": "rsub", "password": "s3cret-pw"},
        bad={"user": "rsub", "password": "not-the-password"},
        error="Authorization Violation",
    )


def _token(tmp: Path, certs: Certs) -> AuthCase:
    return AuthCase(
        server={"authorization": {"token": "t0ken-for-rsub"}},
        good={"token": "t0ken-for-rsub"},
        bad={"token": "a-guessed-token"},
        error="Authorization Violation",
    )


def _creds_file(tmp: Path, certs: Certs) -> AuthCase:
    trusted = operator_setup()
    # A user JWT signed by an account of another operator: well formed, not trusted.
    stranger = operator_setup()
    good = write_creds(tmp / "sidecar.creds", trusted.user_creds("rsub-sidecar"))
    bad = write_creds(tmp / "stranger.creds", stranger.user_creds("rsub-sidecar"))
    return AuthCase(
        server=trusted.server_config(),
        good={"creds_file": str(good)},
        bad={"creds_file": str(bad)},
        error="Authorization Violation",
    )


def _server_tls(certs: Certs, *, verify: bool) -> dict[str, Any]:
    tls = {
        "cert_file": str(certs.server_cert),
        "key_file": str(certs.server_key),
        "ca_file": str(certs.ca),
        "timeout": 2,
    }
    return {"tls": {**tls, "verify": verify}}


def _tls_custom_ca(tmp: Path, certs: Certs) -> AuthCase:
    return AuthCase(
        server=_server_tls(certs, verify=False),
        good={"tls": {"ca_file": str(certs.ca)}},
        bad={"tls": {"ca_file": str(certs.other_ca)}},
        error="CERTIFICATE_VERIFY_FAILED",
        refused="TLS handshake error",
        scheme="tls",
    )


def _tls_server_name(tmp: Path, certs: Certs) -> AuthCase:
    # The certificate names localhost: server_name checks the name, not the dialled IP.
    return AuthCase(
        server=_server_tls(certs, verify=False),
        good={"tls": {"ca_file": str(certs.ca), "server_name": "localhost"}},
        bad={"tls": {"ca_file": str(certs.ca), "server_name": "nats.example.org"}},
        error="CERTIFICATE_VERIFY_FAILED",
        refused="TLS handshake error",
        scheme="tls",
    )


def _mutual_tls(tmp: Path, certs: Certs) -> AuthCase:
    client = {"cert_file": str(certs.client_cert), "key_file": str(certs.client_key)}
    intruder = {"cert_file": str(certs.other_client_cert), "key_file": str(certs.other_client_key)}
    return AuthCase(
        server=_server_tls(certs, verify=True),
        good={"tls": {"ca_file": str(certs.ca), **client}},
        bad={"tls": {"ca_file": str(certs.ca), **intruder}},
        error="UNKNOWN_CA",
        refused="TLS handshake error",
        scheme="tls",
    )


def _mutual_tls_without_cert(tmp: Path, certs: Certs) -> AuthCase:
    case = _mutual_tls(tmp, certs)
    return AuthCase(
        server=case.server,
        good=case.good,
        bad={"tls": {"ca_file": str(certs.ca)}},
        error="CERTIFICATE_REQUIRED",
        refused="TLS handshake error",
        scheme="tls",
    )


CASES: dict[str, Callable[[Path, Certs], AuthCase]] = {
    "user_password": _user_password,
    "token": _token,
    "creds_file_operator_jwt": _creds_file,
    "tls_custom_ca": _tls_custom_ca,
    "tls_server_name": _tls_server_name,
    "mutual_tls": _mutual_tls,
    "mutual_tls_no_client_cert": _mutual_tls_without_cert,
}


def sidecar_config(url: str, nats: dict[str, Any]) -> Config:
    return config_from_mapping(
        {
            "region": "west",
            "regions": ["west", "east"],
            "streams": [{"name": "orders"}],
            "nats": {"servers": [url], "connect_timeout_s": 1, **nats},
        }
    )


async def jetstream_round_trip(conn: NatsConnection) -> int:
    """Create a stream, publish to it, and return its last sequence as the server reports it."""
    await conn.js.add_stream(name="sec-probe", subjects=["sec.probe.>"], max_consumers=4)
    ack = await conn.js.publish("sec.probe.1", b"hello", stream="sec-probe")
    info = await conn.js.stream_info("sec-probe")
    assert info.state.last_seq == ack.seq == 1
    return info.state.last_seq


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path, certs: Certs) -> AuthCase:
    return CASES[request.param](tmp_path, certs)


async def test_mode_connects_and_jetstream_works(case: AuthCase, tmp_path: Path) -> None:
    async with LoneServer(tmp_path / "server", case.server, scheme=case.scheme) as server:
        conn = NatsConnection(sidecar_config(server.url, case.good).nats, name="rsub-security")
        try:
            await asyncio.wait_for(conn.connect(), 15)
            assert conn.connected
            assert await jetstream_round_trip(conn) == 1
        finally:
            await conn.close()


@dataclass
class Attempt:
    connected: bool
    raised: Exception | None
    events: list[MutableMapping[str, Any]]
    server_log: str


async def _attempt_with_bad_settings(case: AuthCase, tmp_path: Path) -> Attempt:
    """Try to connect with the bad settings for a short while; return what happened."""
    raised: Exception | None = None
    async with LoneServer(tmp_path / "server", case.server, scheme=case.scheme) as server:
        conn = NatsConnection(sidecar_config(server.url, case.bad).nats, name="rsub-security")
        with structlog.testing.capture_logs() as events:
            try:
                await asyncio.wait_for(conn.connect(), _FAIL_BUDGET_S)
            except TimeoutError:
                pass  # still retrying
            except Exception as exc:  # failing fast is fine if it says why (checked below)
                raised = exc
            finally:
                connected = conn.connected
                await conn.close()
        return Attempt(connected, raised, events, server.log_text())


async def test_wrong_credentials_never_connect_and_say_why(case: AuthCase, tmp_path: Path) -> None:
    attempt = await _attempt_with_bad_settings(case, tmp_path)
    events, server_log = attempt.events, attempt.server_log
    assert not attempt.connected
    if attempt.raised is not None:
        assert case.error.lower().replace("_", " ") in str(attempt.raised).lower().replace(
            "_", " "
        ), attempt.raised
    assert not [e for e in events if e["event"] in ("nats_connected", "nats_reconnected")]
    problems = [e for e in events if e["log_level"] in ("warning", "error")]
    assert any(case.error in str(e.get("error")) for e in problems), problems
    # Secrets never reach the logs, not even the rejected ones.
    for secret in (case.bad.get("password"), case.bad.get("token")):
        assert secret is None or secret not in str(events)
    # A clear line, not a traceback dump.
    assert not [e for e in events if e.get("exc_info")], events
    assert "Traceback" not in "".join(str(e) for e in events)
    # The server saw the client and refused it (so the test did reach the server).
    assert case.refused in server_log


async def test_wrong_password_fails_fast_at_start(tmp_path: Path, certs: Certs) -> None:
    case = _user_password(tmp_path, certs)
    async with LoneServer(tmp_path / "server", case.server) as server:
        conn = NatsConnection(sidecar_config(server.url, case.bad).nats, name="rsub-security")
        try:
            with pytest.raises(Exception) as info:
                await asyncio.wait_for(conn.connect(), 6)
        finally:
            await conn.close()
    assert not isinstance(info.value, TimeoutError)
    assert "authorization" in str(info.value).lower()
