"""The sidecar's NATS connection: waits for a server, survives restarts, reports its state."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest
import structlog
from nats.errors import AuthorizationError

from rsub_dev.ports import refusing_socket
from sidecar.config.nats import NatsConfig, NatsTlsConfig
from sidecar.config.secrets import Secret
from sidecar.nats.connection import (
    NatsConnection,
    NatsRefused,
    QuietRepeats,
    auth_method,
    connect_options,
    refusal,
    server_address,
    tls_context,
)
from tests.support.nats_servers import LoneServer, password_users


async def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_connects_once_the_server_appears_and_follows_restarts(
    stopped_server: LoneServer,
) -> None:
    server = stopped_server
    changes: list[bool] = []
    conn = NatsConnection(
        NatsConfig(servers=(server.url,), connect_timeout_s=0.5),
        name="test",
        on_change=changes.append,
    )
    connecting = asyncio.create_task(conn.connect())
    await asyncio.sleep(0.5)
    assert not conn.connected and not connecting.done()
    server.start()
    try:
        await asyncio.wait_for(connecting, 20)
        assert conn.connected
        await conn.nc.publish("x", b"1")

        server.stop()
        await wait_for(lambda: not conn.connected, "disconnect")
        server.start()
        await wait_for(lambda: conn.connected, "reconnect")
        await conn.nc.publish("x", b"2")
        assert changes == [True, False, True]
    finally:
        await conn.close()
    assert not conn.connected and changes[-1] is False


async def test_close_stops_a_pending_connect() -> None:
    conn = NatsConnection(
        NatsConfig(servers=("nats://127.0.0.1:1",), connect_timeout_s=0.2), name="test"
    )
    connecting = asyncio.create_task(conn.connect())
    await asyncio.sleep(0.3)
    await conn.close()
    await asyncio.wait_for(connecting, 10)
    assert not conn.connected


def test_options_carry_credentials_and_reconnect_forever() -> None:
    options = connect_options(
        NatsConfig(servers=("nats://a:4222", "nats://b:4222"), user="u", password=Secret("p"))
    )
    assert options["servers"] == ["nats://a:4222", "nats://b:4222"]
    assert (options["user"], options["password"]) == ("u", "p")
    assert options["max_reconnect_attempts"] == -1 and options["allow_reconnect"]
    assert "tls" not in options and "token" not in options
    token = connect_options(NatsConfig(servers=("nats://a:4222",), token=Secret("t")))
    assert token["token"] == "t" and "user" not in token


def test_tls_context_uses_the_configured_ca_and_server_name() -> None:
    ca = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    tls = NatsTlsConfig(ca_file=ca, server_name="nats.internal")
    context = tls_context(tls)
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    options = connect_options(NatsConfig(servers=("tls://a:4222",), tls=tls))
    assert options["tls"] is not None and options["tls_hostname"] == "nats.internal"
    assert tls_context(NatsTlsConfig()) is None


@pytest.mark.integration
async def test_a_refused_first_connection_raises_naming_the_user(tmp_path: Path) -> None:
    server = LoneServer(tmp_path, password_users(("rsub", "right-pw")))
    server.start()
    config = NatsConfig(servers=(server.url,), user="rsub", password=Secret("wrong-pw"))
    conn = NatsConnection(config, name="test")
    try:
        with pytest.raises(NatsRefused) as info:
            await asyncio.wait_for(conn.connect(), 20)
    finally:
        await conn.close()
        server.stop()
    message = str(info.value)
    assert message.startswith("NATS refused the connection (user/password for user 'rsub')")
    assert "authorization violation" in message and "wrong-pw" not in message
    assert not conn.connected


@pytest.mark.integration
async def test_refusals_after_the_first_connection_are_retried(tmp_path: Path) -> None:
    server = LoneServer(tmp_path, password_users(("rsub", "pw-1")))
    server.start()
    changes: list[bool] = []
    config = NatsConfig(servers=(server.url,), user="rsub", password=Secret("pw-1"))
    conn = NatsConnection(config, name="test", on_change=changes.append)
    try:
        await asyncio.wait_for(conn.connect(), 20)
        # The password changes on the server: every reconnection is refused, none is final.
        server.stop()
        server.configure(password_users(("rsub", "pw-2")))
        server.start()
        await wait_for(
            lambda: server.log_text().count("authentication error") >= 2, "two refused reconnects"
        )
        assert not conn.connected
        server.stop()
        server.configure(password_users(("rsub", "pw-1")))
        server.start()
        await wait_for(lambda: conn.connected, "reconnect once the password is back")
        await conn.nc.publish("x", b"1")
        assert changes == [True, False, True]
    finally:
        await conn.close()
        server.stop()


@pytest.mark.integration
async def test_nats_errors_name_the_server_never_its_user_info(tmp_path: Path) -> None:
    """Two servers, each failing in its own way once the password changed on the first:
    every `nats_error` names the server it is about (an authorization violation does not say
    which server refused), as `scheme://host:port`, never a URL's user info."""
    server = LoneServer(tmp_path, password_users(("rsub", "pw-1")))
    server.start()
    refusing = refusing_socket()  # bound, not listening: connections are refused
    port = refusing.getsockname()[1]
    config = NatsConfig(
        servers=(server.url, f"nats://ops:url-secret-pw@127.0.0.1:{port}"),
        user="rsub",
        password=Secret("pw-1"),
    )
    conn = NatsConnection(config, name="test")
    try:
        with structlog.testing.capture_logs() as events:
            await asyncio.wait_for(conn.connect(), 20)
            server.stop()
            server.configure(password_users(("rsub", "pw-2")))
            server.start()

            def errors_of(url: str) -> list[str]:
                return [
                    e["error"] for e in events if e["event"] == "nats_error" and e["server"] == url
                ]

            await wait_for(
                lambda: (
                    any("Authorization Violation" in e for e in errors_of(server.url))
                    and bool(errors_of(f"nats://127.0.0.1:{port}"))
                ),
                "the refusal by the first server and an error from the second",
            )
    finally:
        await conn.close()
        server.stop()
        refusing.close()
    assert all("Authorization" not in e for e in errors_of(f"nats://127.0.0.1:{port}"))
    errors = [e for e in events if e["event"] == "nats_error"]
    assert {e["server"] for e in errors} <= {server.url, f"nats://127.0.0.1:{port}"}
    assert "url-secret-pw" not in repr(events)


def test_errors_taking_turns_are_each_logged_then_held_back() -> None:
    """Three servers failing in turn, one a second each: each server's error is logged at
    once and then ever more rarely, on its own schedule."""
    now = [0.0]
    quiet = QuietRepeats(max_gap_s=60, clock=lambda: now[0])
    logged: dict[str, list[tuple[float, int]]] = {}
    for second in range(600):
        now[0] = float(second)
        key = f"nats://10.0.0.{second % 3}:4222 ConnectionRefusedError(111)"
        if quiet.due(key):
            logged.setdefault(key, []).append((now[0], quiet.held_back))
            quiet.logged()
    assert len(logged) == 3
    for key, times in logged.items():
        first = times[0][0]
        assert first < 3, key
        # Seen every 3 s: logged 1, 2, 4, 8, ... s (up to a minute) after the last time.
        after = [t - first for t, _ in times]
        assert after[:10] == [0, 3, 6, 9, 15, 24, 42, 75, 135, 195], key
        assert len(times) == 16, key
        # What was held back in between, its own occurrences only (every 3 s).
        assert [held for _, held in times[:7]] == [0, 0, 0, 0, 1, 2, 5], key


def test_refusal_recognises_credential_and_certificate_errors_only() -> None:
    violation = "server says 'authorization violation'"
    assert refusal(Exception("nats: 'Authorization Violation'")) == violation
    assert refusal(AuthorizationError()) == violation
    expired = refusal(Exception("nats: 'User Authentication Expired'"))
    assert expired == "server says 'authentication expired'"
    assert refusal(Exception("nats: 'Authentication Revoked'")) is not None
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.reason, verify.verify_message = "CERTIFICATE_VERIFY_FAILED", "Hostname mismatch"
    assert refusal(verify) == "TLS CERTIFICATE_VERIFY_FAILED (Hostname mismatch)"
    # A dropped connection or a missing server is worth retrying.
    for transient in (
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        Exception("nats: 'Stale Connection'"),
    ):
        assert refusal(transient) is None, transient


def test_auth_method_names_the_method_never_the_secret(tmp_path: Path) -> None:
    servers = ("nats://a:4222",)
    by_user = auth_method(NatsConfig(servers=servers, user="app", password=Secret("pw-42")))
    assert by_user == "user/password for user 'app'"
    assert auth_method(NatsConfig(servers=servers, token=Secret("tok-42"))) == "token"
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "me.pem", "me.key"))
    for path in (ca, cert, key):
        path.write_text("-----BEGIN-----\n")
    tls = NatsTlsConfig(ca_file=ca, cert_file=cert, key_file=key)
    described = auth_method(NatsConfig(servers=servers, tls=tls))
    assert described == f"no credentials, TLS with CA file '{ca}', client cert '{cert}'"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://ops:s3cret-pw@127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("tls://tok3n-value@nats.example:4443", "tls://nats.example:4443"),
        ("nats://[::1]:4222", "nats://[::1]:4222"),
    ],
)
def test_server_address_never_shows_user_info(url: str, shown: str) -> None:
    assert server_address(urlparse(url)) == shown


def test_a_repeating_error_is_logged_ever_more_rarely() -> None:
    now = [0.0]
    quiet = QuietRepeats(max_gap_s=60, clock=lambda: now[0])
    logged: list[tuple[float, int]] = []
    for second in range(3600):  # NATS unreachable for an hour, one failure a second
        now[0] = float(second)
        if quiet.due("ConnectionRefusedError(111)"):
            logged.append((now[0], quiet.held_back))
            quiet.logged()
    assert len(logged) < 70  # 1, 2, 4, ... 32 s apart, then once a minute
    assert logged[:4] == [(0.0, 0), (1.0, 0), (2.0, 0), (4.0, 1)]
    assert all(b - a <= 60 for (a, _), (b, _) in itertools.pairwise(logged))
    assert sum(held for _, held in logged) + len(logged) + quiet.held_back == 3600
    # Another error, or the same after a reconnect, is logged at once.
    assert quiet.due("TimeoutError()")
    quiet.reset()
    assert quiet.due("TimeoutError()")
