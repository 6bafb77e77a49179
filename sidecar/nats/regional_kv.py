"""Key-value buckets placed in one region's cluster.

`js.create_key_value(placement=...)` ignores the placement (DESIGN §8), so the bucket's
backing stream `KV_<bucket>` is created here with the KV layout and the placement, and then
bound (`key_value`), all through the region's port (`JetStreamPort`).

The bucket keeps a region's leases and cursors: with one replica, losing the one server that
holds it stops leadership and `CommitCursor` in the region (docs/reliability.md, seed 7). It
is therefore replicated: `replicas` when given, else as many as the cluster can place up to
`DEFAULT_REPLICAS`. A bucket found with fewer replicas is raised (a stream update can add
replicas); one that cannot be raised is used as it is. Fewer replicas than wanted is logged
at warning level when `replicas` was given, at info level otherwise: a cluster too small
for more (a one-server region) is then what the operator runs, not a fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from sidecar.nats.port import STREAM_NOT_FOUND, ApiJson, JetStreamPort, KeyValueBucket

log = structlog.get_logger(__name__)

# Replicas of a bucket when none are configured, fewer when the cluster has fewer servers.
DEFAULT_REPLICAS = 3
# The server rejects re-creating a stream with a different configuration with this code.
_STREAM_NAME_IN_USE = 10058
# The server cannot place that many replicas: "insufficient resources" (fewer servers in
# the cluster) and "replicas > 1 not supported in non-clustered mode" (a stand-alone server).
_CANNOT_PLACE = frozenset({10005, 10074})
# nats-py's default for its JetStream requests, which this module made before the port.
_REQUEST_TIMEOUT_S = 5.0
_NS_PER_S = 1_000_000_000


def kv_stream_config(bucket: str, cluster: str, replicas: int) -> ApiJson:
    """The backing stream of KV bucket `bucket`, placed in cluster `cluster` (the server's
    JSON, as nats-py sends a key-value bucket's stream)."""
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "max_consumers": 64,
        "discard": "new",
        "discard_new_per_subject": False,
        "max_msgs_per_subject": 1,
        "max_msg_size": -1,
        "storage": "file",
        "num_replicas": replicas,
        "no_ack": False,
        "duplicate_window": 120 * _NS_PER_S,
        "placement": {"cluster": cluster},
        "sealed": False,
        "deny_delete": True,
        "deny_purge": False,
        "allow_rollup_hdrs": True,
        "allow_direct": True,
        "max_age": 0,
    }


async def open_regional_kv(
    port: JetStreamPort, bucket: str, cluster: str, *, replicas: int | None = None
) -> KeyValueBucket:
    """Create (if absent) and bind the KV bucket `bucket`, placed in cluster `cluster`, with
    `replicas` replicas (None: as many as the cluster can place, up to `DEFAULT_REPLICAS`)."""
    wanted = [replicas] if replicas is not None else list(range(DEFAULT_REPLICAS, 0, -1))
    fewer = log.warning if replicas is not None else log.info  # fewer replicas than wanted
    try:
        info = await port.stream_info(f"KV_{bucket}", timeout_s=_REQUEST_TIMEOUT_S)
    except APIError as err:
        if err.err_code != STREAM_NOT_FOUND:
            raise
        await _create(port, bucket, cluster, wanted, fewer)
    else:
        await _raise_replicas(port, bucket, info["config"], wanted, fewer)
    return await port.key_value(bucket)


async def _create(
    port: JetStreamPort, bucket: str, cluster: str, wanted: list[int], fewer: Callable[..., Any]
) -> None:
    for count in wanted:
        try:
            await port.stream_create(
                kv_stream_config(bucket, cluster, count), timeout_s=_REQUEST_TIMEOUT_S
            )
        except APIError as err:
            if err.err_code == _STREAM_NAME_IN_USE:
                # Created meanwhile (another replica) with another configuration: use it.
                log.warning("kv_bucket_config_differs", bucket=bucket, cluster=cluster)
                return
            if err.err_code not in _CANNOT_PLACE or count == wanted[-1]:
                log.error(
                    "kv_bucket_not_created",
                    bucket=bucket,
                    cluster=cluster,
                    replicas=count,
                    error=err.description,
                )
                raise
            continue
        if count < wanted[0]:
            fewer(
                "kv_bucket_replicas_reduced",
                bucket=bucket,
                cluster=cluster,
                replicas=count,
                wanted=wanted[0],
                reason="the cluster cannot place more",
            )
        return


async def _raise_replicas(
    port: JetStreamPort,
    bucket: str,
    config: ApiJson,
    wanted: list[int],
    fewer: Callable[..., Any],
) -> None:
    """Raise an existing bucket's replicas to the first count of `wanted` the cluster can
    place; never lowers them. A bucket that cannot be raised is used as it is, said with
    `fewer`. The update sends the server's own configuration back, only the replicas
    changed."""
    current = config.get("num_replicas") or 1
    error = ""
    for count in (c for c in wanted if c > current):
        try:
            await port.stream_update(
                {**config, "num_replicas": count}, timeout_s=_REQUEST_TIMEOUT_S
            )
        except APIError as err:
            error = err.description or repr(err)
            continue
        except (TimeoutError, NatsError) as err:  # e.g. no permission: the request times out
            error = repr(err)
            continue
        log.info("kv_bucket_replicas_raised", bucket=bucket, replicas=count, before=current)
        return
    if wanted[0] > current:
        fewer(
            "kv_bucket_replicas_low",
            bucket=bucket,
            replicas=current,
            wanted=wanted[0],
            error=error,
            consequence="losing the server that holds it stops leadership and cursors here",
        )
