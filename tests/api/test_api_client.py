"""The gRPC client builder as Spark uses it: `SidecarClient` over TLS with a bearer token.

The server is the real gRPC server over the in-memory backend. `SidecarClient` blocks, so
its calls run in a thread while the server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.api.client import SidecarClient, SidecarError
from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.config.schema import GrpcTlsConfig
from spark_jobs.rsub_spark.cursor import cursor_position, sidecar_client
from spark_jobs.rsub_spark.options import parse_options
from tests.support.api_fakes import STREAM, SUBSCRIPTION, Certs, MemoryBackend

TOKEN = "cl1ent-t0ken"


@pytest.fixture
async def mutual_tls_server(
    backend: MemoryBackend, certs: Certs
) -> AsyncIterator[GrpcServerHandle]:
    tls = GrpcTlsConfig(
        cert_file=certs.server_cert, key_file=certs.server_key, client_ca_file=certs.ca
    )
    server = await start_grpc_server(backend, "127.0.0.1:0", auth_token=TOKEN, tls=tls)
    yield server
    await server.stop(None)


def spark_client(server: GrpcServerHandle, certs: Certs, **extra: str) -> SidecarClient:
    """The client the Spark source builds from its options (certificates name localhost)."""
    options = {
        "servers": "nats://127.0.0.1:4222",
        "stream": STREAM,
        "region": "west",
        "sidecar": f"localhost:{server.port}",
        "sidecarToken": TOKEN,
        "timeoutMs": "3000",
        "sidecarTlsCa": str(certs.ca),
        "sidecarTlsCert": str(certs.client_cert),
        "sidecarTlsKey": str(certs.client_key),
    }
    return sidecar_client(parse_options({**options, **extra}))


async def test_commits_a_cursor_over_mutual_tls_with_the_token(
    mutual_tls_server: GrpcServerHandle, backend: MemoryBackend, certs: Certs
) -> None:
    backend.make_cursor(SUBSCRIPTION)
    client = spark_client(mutual_tls_server, certs)
    try:
        assert await asyncio.to_thread(client.commit, STREAM, SUBSCRIPTION, 60) == 60
        position, progress = await asyncio.to_thread(cursor_position, client, STREAM, SUBSCRIPTION)
        assert (position, dict(progress), progress.acked) == (60, {"east": 9}, {})
    finally:
        client.close()
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 60


async def test_a_wrong_token_is_denied_over_tls(
    mutual_tls_server: GrpcServerHandle, certs: Certs
) -> None:
    client = spark_client(mutual_tls_server, certs, sidecarToken="guessed")
    try:
        with pytest.raises(SidecarError, match=r"CommitCursor .* failed with PERMISSION_DENIED"):
            await asyncio.to_thread(client.commit, STREAM, SUBSCRIPTION, 60)
    finally:
        client.close()


async def test_without_the_ca_the_sidecar_is_unreachable(
    mutual_tls_server: GrpcServerHandle, backend: MemoryBackend
) -> None:
    client = SidecarClient(f"localhost:{mutual_tls_server.port}", token=TOKEN, timeout_s=2)
    try:
        with pytest.raises(SidecarError, match="unreachable during CommitCursor"):
            await asyncio.to_thread(client.commit, STREAM, SUBSCRIPTION, 60)
    finally:
        client.close()
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 41


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sidecarTlsCa": "/nonexistent/ca.pem"}, "option sidecarTlsCa: cannot read"),
        ({"sidecarTlsKey": ""}, "option sidecarTlsCert and option sidecarTlsKey go together"),
        ({"sidecarTlsCa": ""}, "option sidecarTlsCert needs option sidecarTlsCa"),
    ],
)
async def test_unusable_tls_files_are_named(
    mutual_tls_server: GrpcServerHandle, certs: Certs, extra: dict[str, str], message: str
) -> None:
    with pytest.raises(SidecarError, match=message):
        spark_client(mutual_tls_server, certs, **extra)


async def test_a_file_that_is_no_certificate_is_named_not_blamed_on_the_network(
    mutual_tls_server: GrpcServerHandle, certs: Certs, tmp_path: Path
) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("this is not a certificate\n")
    with pytest.raises(SidecarError, match=r"sidecarTlsCa: .* holds no PEM certificate"):
        spark_client(mutual_tls_server, certs, sidecarTlsCa=str(garbage))
    with pytest.raises(SidecarError, match="are not a PEM certificate and its key"):
        spark_client(mutual_tls_server, certs, sidecarTlsKey=str(certs.other_client_key))


def test_tls_options_are_parsed_as_paths() -> None:
    base = {"servers": "nats://a:4222", "stream": STREAM, "region": "west"}
    opts = parse_options({**base, "sidecarTLSca": "/etc/rsub/ca.pem"})
    assert (opts.sidecar_tls_ca, opts.sidecar_tls_cert, opts.sidecar_tls_key) == (
        Path("/etc/rsub/ca.pem"),
        None,
        None,
    )
