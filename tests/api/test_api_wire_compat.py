"""GetSubscription and WatchSubscription answer as they did in the released schema.

They answered `SubscriptionState` until they got response messages of their own (buf lint
RPC_REQUEST_RESPONSE_UNIQUE); those carry its fields, so clients and servers built on either
schema understand each other. This is why protos/accepted-breaks.txt accepts buf's
RPC_SAME_RESPONSE_TYPE findings for them; buf checks `SubscriptionState` itself against
protos/released.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api import convert
from sidecar.api.client import SidecarClient
from sidecar.api.grpc_server import CURSOR_SERVICE, GrpcServerHandle
from sidecar.exact import progress_of
from spark_jobs.rsub_spark.cursor import cursor_position
from tests.support.api_fakes import STREAM, SUBSCRIPTION, MemoryBackend, StateServer

FieldShape = tuple[object, ...]


def shape(field: FieldDescriptor) -> FieldShape:
    """What the binary and JSON encodings of `field` depend on (a map by its key and value)."""
    nested: object = None
    if field.message_type is not None:
        entry = field.message_type
        nested = (
            tuple(shape(f) for f in entry.fields)
            if entry.GetOptions().map_entry
            else entry.full_name
        )
    elif field.enum_type is not None:
        nested = field.enum_type.full_name
    return (field.number, field.name, field.json_name, field.type, field.is_repeated, nested)


def shapes(message: str) -> set[FieldShape]:
    """The shapes of the fields of api.proto's `message`."""
    return {shape(f) for f in api_pb2.DESCRIPTOR.message_types_by_name[message].fields}


@pytest.mark.parametrize("response", ["GetSubscriptionResponse", "WatchSubscriptionResponse"])
def test_the_response_messages_carry_every_field_of_subscription_state(response: str) -> None:
    assert shapes("SubscriptionState") - shapes(response) == set()


async def test_a_client_of_the_released_schema_reads_the_answers(
    grpc_server: GrpcServerHandle, backend: MemoryBackend
) -> None:
    # What stubs generated from protos/released send and decode.
    request = api_pb2.GetSubscriptionRequest(stream=STREAM, subscription=SUBSCRIPTION)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        get = channel.unary_unary(
            f"/{CURSOR_SERVICE}/GetSubscription",
            request_serializer=api_pb2.GetSubscriptionRequest.SerializeToString,
            response_deserializer=api_pb2.SubscriptionState.FromString,
        )
        watch = channel.unary_stream(
            f"/{CURSOR_SERVICE}/WatchSubscription",
            request_serializer=api_pb2.WatchSubscriptionRequest.SerializeToString,
            response_deserializer=api_pb2.SubscriptionState.FromString,
        )
        state = await get(request)
        call = watch(api_pb2.WatchSubscriptionRequest(stream=STREAM, subscription=SUBSCRIPTION))
        first = await asyncio.wait_for(call.read(), 10)
        call.cancel()
    view = backend.subscriptions[STREAM][SUBSCRIPTION]
    assert isinstance(state, api_pb2.SubscriptionState)
    assert convert.subscription_from_proto(state) == view
    assert convert.subscription_from_proto(first) == view


async def test_clients_read_the_answers_of_a_server_on_the_released_schema() -> None:
    backend = MemoryBackend()
    backend.make_cursor(SUBSCRIPTION)  # the Spark source reads external cursors only
    view = backend.subscriptions[STREAM][SUBSCRIPTION]
    server = StateServer([convert.subscription_to_proto(view, api_pb2.SubscriptionState)])
    request = api_pb2.GetSubscriptionRequest(stream=STREAM, subscription=SUBSCRIPTION)
    spark = SidecarClient(server.address, timeout_s=5)
    try:
        with grpc.insecure_channel(server.address) as channel:
            state = api_pb2_grpc.CursorServiceStub(channel).GetSubscription(request, timeout=5)
        assert isinstance(state, api_pb2.GetSubscriptionResponse)
        assert convert.subscription_from_proto(state) == view
        assert await progress_of(server.address, STREAM, SUBSCRIPTION) == view.progress
        assert spark.subscription(STREAM, SUBSCRIPTION) == view
        assert cursor_position(spark, STREAM, SUBSCRIPTION) == (view.mark_delete, view.progress)
    finally:
        spark.close()
        server.stop()
