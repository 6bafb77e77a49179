"""The first inputs of each target's corpus: one valid input of every kind it reads, laid out
as the target takes them (`targets.py`), so the fuzzer starts from what is accepted."""

from __future__ import annotations

import yaml

from sidecar.protocol import (
    Marker,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    SubscriptionKind,
    Update,
    encode,
)
from sidecar.protocol.markers import Body
from tests.fuzz.targets import ENV_SEPARATOR, STREAM, SUBJECTS, VS, api_methods

_WEST = SUBJECTS.index(VS.marker_subject("west")).to_bytes(1, "big")


def _markers() -> list[bytes]:
    own, theirs = SnapshotId("west", 3, 7), SnapshotId("east", 2, 5)
    bodies: list[Body] = [
        Request(own, 1),
        Response(theirs, 2, 17),
        Snapshot(own, 40, {"east": 33, "central": 12}, 1_700_000_000_000, 1_700_000_000_050),
        Update("billing", SubscriptionKind.DURABLE, own, 40, {"east": 33}, b'{"ack_policy":1}'),
        Update(
            "spark",
            SubscriptionKind.EXTERNAL,
            None,
            0,
            {},
            b"",
            progress={"west": 9, "east": 4},
            progress_position=13,
        ),
    ]
    return [_WEST + encode(Marker("west", STREAM, 3, body)) for body in bodies]


def _origins() -> list[bytes]:
    return [
        b"orders-write-west 3 orders.west.> > orders.west.x WWR8jvrr",
        b"orders-write-east 17 orders.east.>\f_rsub.orders.marker.east "
        b"orders.>\f_rsub.orders.marker.east orders.east.a.b UtEAuh5y",
        b"orders-write-east:Zs0kQ0Ib 5 orders.east.> > orders.east.a x",
    ]


def _config() -> list[bytes]:
    minimal = {
        "region": "west",
        "regions": ["west", "central", "east"],
        "nats": {"servers": ["nats://user:pass@127.0.0.1:4222"]},
        "streams": [{"name": "orders"}],
    }
    full = {
        **minimal,
        "cluster_for_region": {"west": "w1"},
        "snapshot": {"interval_ms": 500, "timeout_s": 30, "cache_size": 10},
        "progress": {"enabled": False},
        "lease": {"ttl_s": 6, "bucket": "rsub"},
        "grpc": {"listen": "0.0.0.0:50051"},
        "http": {"listen": "0.0.0.0:8080"},
        "log": {"level": "debug", "format": "json"},
    }
    env = b"RSUB_SNAPSHOT__INTERVAL_MS=250\nRSUB_LOG__LEVEL=info\nRSUB_REGOIN=west"
    return [
        yaml.safe_dump(minimal).encode(),
        yaml.safe_dump(full).encode(),
        env + ENV_SEPARATOR + yaml.safe_dump(minimal).encode(),
    ]


def _api() -> list[bytes]:
    seeds = []
    for index, (_service, method, request_type) in enumerate(api_methods()):
        fields = {
            "stream": STREAM,
            # An external cursor for the cursor writes (the commit, first, creates it; the
            # reset finds it); the in-memory backend's durable for the others.
            "subscription": "spark-1" if method in ("CommitCursor", "ResetCursor") else "billing",
            "sequence": 41,
            "replicated": True,
        }
        request = request_type(
            **{k: v for k, v in fields.items() if k in request_type.DESCRIPTOR.fields_by_name}
        )
        seeds.append(bytes([index, 1]) + request.SerializeToString())
    return seeds


SEEDS = {"markers": _markers, "origins": _origins, "config": _config, "api": _api}
