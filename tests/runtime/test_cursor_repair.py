"""A cursor commit beyond the read stream is refused, and a cursor already wrong is repaired
with `ResetCursor`, on a real sidecar (issue 21, item 7)."""

from __future__ import annotations

import grpc
import nats
import pytest
from structlog.testing import capture_logs

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.nats.cursors import CursorStore
from tests.support.rsub_process import rsub_command

pytestmark = pytest.mark.integration

STREAM = "orders"
READ_STREAM = f"{STREAM}-read-west"
U64_MAX = 2**64 - 1


async def test_commits_beyond_the_read_stream_are_refused_and_a_wrong_cursor_is_reset(
    cluster2: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster2, streams=[STREAM], regions=["west"]) as sidecars:
        west = sidecars["west"]
        nc = await nats.connect(cluster2.servers("west"))
        js = nc.jetstream()
        try:
            for i in range(3):
                await js.publish(f"{STREAM}.west.x", str(i).encode(), stream=f"{STREAM}-write-west")

            async def sourced() -> bool:
                return (await js.stream_info(READ_STREAM)).state.messages >= 3

            await wait_until(sourced, "the data in west's read stream")
            last = (await js.stream_info(READ_STREAM)).state.last_seq
            store = CursorStore(await js.key_value("rsub-leases-west"))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{west.grpc_port}") as channel:
                cursor = api_pb2_grpc.CursorServiceStub(channel)
                admin = api_pb2_grpc.AdminServiceStub(channel)

                async def commit(subscription: str, sequence: int) -> int:
                    reply = await cursor.CommitCursor(
                        api_pb2.CommitCursorRequest(
                            stream=STREAM, subscription=subscription, sequence=sequence
                        )
                    )
                    return int(reply.mark_delete)

                async def mark_delete(subscription: str) -> int:
                    state = await cursor.GetSubscription(
                        api_pb2.GetSubscriptionRequest(stream=STREAM, subscription=subscription)
                    )
                    return int(state.mark_delete)

                # Beyond the last sequence + 1: refused, naming the field and the limit, and
                # nothing is stored (a new cursor is not even created).
                for beyond in (U64_MAX, last + 2):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await commit("spark", beyond)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert refused.value.details() == (
                        f"sequence: {beyond} is beyond read stream '{READ_STREAM}': at most "
                        f"{last + 1} (its last sequence, {last}, + 1)"
                    )
                assert await store.load(STREAM) == {}
                assert await commit("spark", last + 1) == last + 1  # the limit itself
                assert await commit("spark", last) == last + 1

                # A cursor poisoned before this check: forward-only commits cannot repair it.
                await store.advance(STREAM, "poisoned", U64_MAX)

                async def poisoned_seen() -> bool:
                    try:
                        return await mark_delete("poisoned") == U64_MAX
                    except grpc.aio.AioRpcError:
                        return False

                await wait_until(poisoned_seen, "the sidecar to read the poisoned cursor")
                assert await commit("poisoned", 2) == U64_MAX

                # The repair: an admin call of its own, logged.
                with capture_logs() as logs:
                    reply = await admin.ResetCursor(
                        api_pb2.ResetCursorRequest(
                            stream=STREAM, subscription="poisoned", sequence=2
                        )
                    )
                assert (reply.previous_sequence, reply.sequence) == (U64_MAX, 2)
                [reset] = [e for e in logs if e["event"] == "cursor_reset"]
                assert (reset["stream"], reset["subscription"], reset["log_level"]) == (
                    STREAM,
                    "poisoned",
                    "warning",
                )
                assert (reset["previous"], reset["sequence"]) == (U64_MAX, 2)
                # Taken in before the answer; stored; forward commits work again from there.
                assert await mark_delete("poisoned") == 2
                assert (await store.load(STREAM))["poisoned"] == 2
                assert await commit("poisoned", 3) == 3

                # The reset obeys the same limit, and creates nothing.
                for name, sequence, code in (
                    ("poisoned", U64_MAX, grpc.StatusCode.INVALID_ARGUMENT),
                    ("ghost", 1, grpc.StatusCode.NOT_FOUND),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await admin.ResetCursor(
                            api_pb2.ResetCursorRequest(
                                stream=STREAM, subscription=name, sequence=sequence
                            )
                        )
                    assert refused.value.code() == code
                assert set(await store.load(STREAM)) == {"spark", "poisoned"}

            # The same repair through the command line, as docs/operations.md gives it.
            sidecar = f"127.0.0.1:{west.grpc_port}"
            code, out, err = await rsub_command(
                "reset-cursor", STREAM, "poisoned", "0", "--sidecar", sidecar
            )
            assert (code, err) == (0, "")
            assert out == "external cursor 'poisoned' of stream 'orders' reset from 3 to 0\n"
            code, out, err = await rsub_command(
                "reset-cursor", STREAM, "poisoned", str(U64_MAX), "--sidecar", sidecar
            )
            assert code == 1
            assert err.startswith(f"error: INVALID_ARGUMENT: sequence: {U64_MAX} is beyond")
            assert (await store.load(STREAM))["poisoned"] == 0
        finally:
            await nc.close()
