"""The Spark source reaches a secured NATS through the sidecar's one connection builder:
TLS with a private CA plus user/password; a wrong CA or password fails with a clear error
that never holds the password."""

from __future__ import annotations

import ssl
from pathlib import Path

import nats
import pytest

from spark_jobs.rsub_spark.nats_read import RsubReadError, connect, stream_bounds
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions, parse_options
from tests.support.api_fakes import Certs
from tests.support.nats_servers import LoneServer, password_users

pytestmark = pytest.mark.integration

_PASSWORD = "sp4rk-reader-pw"
_USERS = password_users(("spark", _PASSWORD))


def _options(url: str, ca: Path, password: str = _PASSWORD) -> RsubOptions:
    return parse_options(
        {
            "servers": url,
            "stream": "orders",
            "region": "west",
            "user": "spark",
            "password": password,
            "tlsCa": str(ca),
            "timeoutMs": "3000",
        }
    )


async def test_reads_over_tls_with_user_and_password(tmp_path: Path, certs: Certs) -> None:
    tls = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key), "timeout": 2}
    async with LoneServer(tmp_path, {"tls": tls, **_USERS}, scheme="tls") as server:
        trust = ssl.create_default_context(cafile=str(certs.ca))
        admin = await nats.connect(server.url, user="spark", password=_PASSWORD, tls=trust)
        try:
            await admin.jetstream().add_stream(name="orders-read-west", subjects=["orders.>"])
            await admin.jetstream().publish("orders.a", b"1")
        finally:
            await admin.close()

        nc = await connect(_options(server.url, certs.ca))
        try:
            bounds = await stream_bounds(nc, _options(server.url, certs.ca))
        finally:
            await nc.close()
        assert (bounds.first_seq, bounds.last_seq) == (1, 1)

        with pytest.raises(RsubReadError) as wrong_ca:
            await connect(_options(server.url, certs.other_ca))
        with pytest.raises(RsubReadError) as wrong_password:
            await connect(_options(server.url, certs.ca, password="not-the-" + _PASSWORD))
    assert "CERTIFICATE_VERIFY_FAILED" in str(wrong_ca.value)
    assert "authorization" in str(wrong_password.value).lower()
    for err in (wrong_ca.value, wrong_password.value):
        assert _PASSWORD not in str(err)


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(RsubOptionError, match="option tlsCa: file not found"):
        _options("tls://127.0.0.1:1", tmp_path / "missing-ca.pem")


async def test_a_ca_file_that_is_no_certificate_is_named(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(RsubReadError, match="options tlsCa/tlsCert/tlsKey: cannot use the TLS"):
        await connect(_options("tls://127.0.0.1:1", garbage))


def test_client_cert_and_key_go_together(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(
        RsubOptionError, match="option tlsKey: cert_file and key_file must be set together"
    ):
        parse_options(
            {"servers": "tls://h:4222", "stream": "orders", "region": "west", "tlsCert": str(cert)}
        )
