"""What the Spark client retries, and how a commit that does not take effect shows.

The server is the real gRPC server (with a bearer token) over the in-memory backend, whose
`commit_cursor` is replaced by one that counts its calls and fails as told. `SidecarClient`
blocks, so its calls run in a thread while the server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from rsub_dev.ports import free_ports
from sidecar.api.client import CursorCommitError, SidecarClient
from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.runtime.errors import FailedPrecondition, NotLeader, Unavailable
from spark_jobs.rsub_spark.listener import CursorCommitListener
from spark_jobs.rsub_spark.options import RsubOptionError, parse_options
from tests.support.api_fakes import STREAM, SUBSCRIPTION, MemoryBackend

TOKEN = "s3cret-commit-t0ken"
BACKOFF_S = 0.01


class FailingCommits:
    """`commit_cursor` failing with `errors` in turn, then committing; `calls` counts."""

    def __init__(self, backend: MemoryBackend, errors: list[Exception]) -> None:
        self.calls = 0
        self._commit = backend.commit_cursor
        self._errors = errors

    async def __call__(self, stream: str, subscription: str, sequence: int) -> int:
        self.calls += 1
        if self._errors:
            raise self._errors.pop(0)
        return await self._commit(stream, subscription, sequence)


@pytest.fixture
async def server(backend: MemoryBackend) -> AsyncIterator[GrpcServerHandle]:
    handle = await start_grpc_server(backend, "127.0.0.1:0", auth_token=TOKEN)
    yield handle
    await handle.stop(None)


@pytest.fixture
def client(server: GrpcServerHandle) -> Iterator[SidecarClient]:
    client = SidecarClient(f"127.0.0.1:{server.port}", token=TOKEN, timeout_s=5)
    yield client
    client.close()


def failing(backend: MemoryBackend, *errors: Exception) -> FailingCommits:
    commits = FailingCommits(backend, list(errors))
    backend.commit_cursor = commits  # type: ignore[method-assign]
    return commits


async def commit(client: SidecarClient, sequence: int) -> int:
    return await asyncio.to_thread(
        client.commit_with_retries, STREAM, SUBSCRIPTION, sequence, backoff_s=BACKOFF_S
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotLeader("the leader is 'west-a'"), grpc.StatusCode.FAILED_PRECONDITION),
        (FailedPrecondition("no"), grpc.StatusCode.FAILED_PRECONDITION),
        (RuntimeError("a bug"), grpc.StatusCode.INTERNAL),
    ],
)
async def test_a_final_answer_is_not_retried_and_is_reported(
    client: SidecarClient, backend: MemoryBackend, error: Exception, code: grpc.StatusCode
) -> None:
    commits = failing(backend, error)
    with capture_logs() as logs, pytest.raises(CursorCommitError) as raised:
        await commit(client, 50)
    assert commits.calls == 1
    assert (raised.value.code, raised.value.sequence, raised.value.attempts) == (code, 50, 1)
    assert client.commit_failures == 1
    [failed] = [e for e in logs if e["event"] == "rsub.cursor_commit_failed"]
    assert (failed["code"], failed["sequence"], failed["log_level"]) == (code.name, 50, "error")
    assert not [e for e in logs if e["event"] == "rsub.cursor_commit_retrying"]
    assert TOKEN not in repr(logs)
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 41


async def test_unavailable_is_retried_until_the_commit_takes_effect(
    client: SidecarClient, backend: MemoryBackend
) -> None:
    commits = failing(backend, Unavailable("NATS down"), Unavailable("NATS down"))
    with capture_logs() as logs:
        assert await commit(client, 50) == 50
    assert commits.calls == 3 and client.commit_failures == 0
    retries = [e for e in logs if e["event"] == "rsub.cursor_commit_retrying"]
    assert [(e["code"], e["retry_in_s"]) for e in retries] == [
        ("UNAVAILABLE", BACKOFF_S),
        ("UNAVAILABLE", 2 * BACKOFF_S),
    ]
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 50


async def test_retries_are_bounded(client: SidecarClient, backend: MemoryBackend) -> None:
    commits = failing(backend, *[Unavailable("NATS down") for _ in range(5)])
    with pytest.raises(CursorCommitError) as raised:
        await commit(client, 50)
    assert commits.calls == 3 == raised.value.attempts
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE and client.commit_failures == 1


def progress_event(sequence: int) -> Any:
    """A query progress event as the listener reads it (the fields it uses)."""
    end = json.dumps({"stream": f"{STREAM}-read-west", "sequence": sequence})
    return SimpleNamespace(
        progress=SimpleNamespace(name=None, batchId=1, sources=[SimpleNamespace(endOffset=end)])
    )


async def test_the_listener_never_takes_a_failed_commit_for_done(
    server: GrpcServerHandle, backend: MemoryBackend
) -> None:
    options = {
        "servers": "nats://127.0.0.1:4222",
        "stream": STREAM,
        "region": "west",
        "subscription": SUBSCRIPTION,
        "sidecar": f"127.0.0.1:{server.port}",
        "sidecarToken": TOKEN,
    }
    backend.make_cursor(SUBSCRIPTION)
    # In a thread: the listener asks the sidecar (served by this loop) what it commits to.
    listener = await asyncio.to_thread(CursorCommitListener, parse_options(options))
    commits = failing(backend, NotLeader("the leader is 'west-a'"))
    await asyncio.to_thread(listener.onQueryProgress, progress_event(50))
    assert commits.calls == 1
    assert listener.committed == 0 and listener.commit_failures == 1
    assert listener.failure is not None and listener.failure.sequence == 50
    with pytest.raises(CursorCommitError, match="did not take effect"):
        await asyncio.to_thread(listener.wait_for, 50, 5.0)
    # The next batch's commit covers the lost one.
    await asyncio.to_thread(listener.onQueryProgress, progress_event(60))
    assert listener.committed == 60 and listener.failure is None
    assert await asyncio.to_thread(listener.wait_for, 50, 0.1)
    assert backend.subscriptions[STREAM][SUBSCRIPTION].mark_delete == 60


def listener_options(server: GrpcServerHandle | None, subscription: str) -> dict[str, str]:
    port = server.port if server is not None else free_ports(1)[0]  # None: nobody listens
    sidecar = f"127.0.0.1:{port}"
    return {
        "servers": "nats://127.0.0.1:4222",
        "stream": STREAM,
        "region": "west",
        "subscription": subscription,
        "sidecar": sidecar,
        "sidecarToken": TOKEN,
        "timeoutMs": "2000",
    }


async def test_the_listener_refuses_a_durable_when_attached(
    server: GrpcServerHandle, backend: MemoryBackend
) -> None:
    commits = failing(backend)
    with pytest.raises(RsubOptionError) as refused:
        await asyncio.to_thread(
            CursorCommitListener, parse_options(listener_options(server, SUBSCRIPTION))
        )
    assert str(refused.value) == (
        f"option subscription: 'billing' is a durable consumer of stream 'orders' (sidecar "
        f"127.0.0.1:{server.port}), not an external cursor: a Spark query commits its progress "
        "to an external cursor of its own. Create one once with `rsub create-cursor orders NAME "
        f"--sidecar 127.0.0.1:{server.port}` (add --token when the sidecar has one; "
        "CursorService.CommitCursor with sequence 0 does the same) and name it in option "
        "subscription (docs/spark.md)"
    )
    assert commits.calls == 0


async def test_the_listener_takes_a_new_cursor_and_an_unreachable_sidecar(
    server: GrpcServerHandle, backend: MemoryBackend
) -> None:
    # Not there yet: its first commit creates it.
    listener = await asyncio.to_thread(
        CursorCommitListener, parse_options(listener_options(server, "orders-totals"))
    )
    await asyncio.to_thread(listener.onQueryProgress, progress_event(50))
    assert listener.committed == 50
    assert backend.subscriptions[STREAM]["orders-totals"].mark_delete == 50
    # Nobody answers: the check is skipped and logged; commits report what they meet.
    with capture_logs() as logs:
        await asyncio.to_thread(
            CursorCommitListener, parse_options(listener_options(None, "orders-totals"))
        )
    [skipped] = [e for e in logs if e["event"] == "rsub.cursor_check_skipped"]
    assert (skipped["subscription"], skipped["log_level"]) == ("orders-totals", "warning")
    assert TOKEN not in repr(logs)
