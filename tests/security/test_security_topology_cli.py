"""`rsub topology apply` on secured single servers: user/password, TLS with a private CA.

The command runs as a real process (`python -m sidecar.cli`), so flags, environment
variables, exit codes and what it prints are what an operator sees.
"""

from __future__ import annotations

import os
from pathlib import Path

import nats
import pytest

from tests.support.api_fakes import Certs
from tests.support.nats_servers import LoneServer, password_users
from tests.support.rsub_process import rsub_command

pytestmark = pytest.mark.integration

_USERS = password_users(("ops", "t0pology-pw"))
# The command reads secrets from these: the test sets them itself or not at all.
_CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("NATS_PASSWORD", "NATS_TOKEN")}


async def rsub_topology_apply(
    url: str, *flags: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Runs `rsub topology apply` for `orders` over west and east; (exit code, stdout, stderr)."""
    argv = ["topology", "apply", "--servers", url, "--regions", "west,east", "--stream", "orders"]
    return await rsub_command(*argv, "--no-placement", *flags, env={**_CLEAN_ENV, **(env or {})})


async def stream_names(url: str, **options: object) -> set[str]:
    nc = await nats.connect(url, **options)
    try:
        return {str(info.config.name) for info in await nc.jsm().streams_info()}
    finally:
        await nc.close()


async def test_apply_with_user_and_password_from_the_environment(tmp_path: Path) -> None:
    async with LoneServer(tmp_path, _USERS) as server:
        code, out, err = await rsub_topology_apply(
            server.url, "--user", "ops", env={"NATS_PASSWORD": "t0pology-pw"}
        )
        assert code == 0, err
        assert "orders-write-west: created" in out
        names = await stream_names(server.url, user="ops", password="t0pology-pw")
    expected = {"orders-write-west", "orders-write-east", "orders-read-west", "orders-read-east"}
    assert names == expected


async def test_apply_over_tls_with_a_private_ca(tmp_path: Path, certs: Certs) -> None:
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), "timeout": 2}
    async with LoneServer(tmp_path, {"tls": tls}, scheme="tls") as server:
        code, _, err = await rsub_topology_apply(server.url, "--tls-ca", str(certs.ca))
        assert code == 0, err
        code, out, err = await rsub_topology_apply(server.url, "--tls-ca", str(certs.ca))
        assert code == 0, err
        assert "orders-read-east: unchanged" in out
        # Without the CA the server's certificate is not trusted: refused, and said so.
        code, _, err = await rsub_topology_apply(server.url)
    assert code == 1
    assert "NATS refused the connection" in err and "CERTIFICATE_VERIFY_FAILED" in err


async def test_wrong_password_fails_clearly_without_showing_it(tmp_path: Path) -> None:
    async with LoneServer(tmp_path, _USERS) as server:
        code, out, err = await rsub_topology_apply(
            server.url, "--user", "ops", "--password", "wr0ng-secret"
        )
        assert await stream_names(server.url, user="ops", password="t0pology-pw") == set()
    assert code == 1
    assert "NATS refused the connection (user/password for user 'ops')" in err
    assert "authorization violation" in err
    assert "wr0ng-secret" not in out + err


async def test_incomplete_credentials_are_refused_before_connecting(tmp_path: Path) -> None:
    # No server is needed: the flags alone are wrong.
    code, _, err = await rsub_topology_apply("nats://127.0.0.1:1", "--user", "ops")
    assert code == 2
    assert "--password (or $NATS_PASSWORD): user and password must be set together" in err
