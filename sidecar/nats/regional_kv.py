"""Key-value buckets placed in one region's cluster.

`js.create_key_value(placement=...)` ignores the placement (DESIGN §8), so the bucket's
backing stream `KV_<bucket>` is created here with the KV layout and the placement, and then
bound with `js.key_value(bucket)`.
"""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue

log = structlog.get_logger(__name__)

# The server rejects re-creating a stream with a different configuration with this code.
_STREAM_NAME_IN_USE = 10058


async def open_regional_kv(
    js: JetStreamContext, bucket: str, cluster: str, *, replicas: int = 1
) -> KeyValue:
    """Create (if absent) and bind the KV bucket `bucket`, placed in cluster `cluster`."""
    config = api.StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        allow_rollup_hdrs=True,
        allow_direct=True,
        deny_delete=True,
        deny_purge=False,
        discard=api.DiscardPolicy.NEW,
        max_msgs_per_subject=1,
        max_consumers=64,
        duplicate_window=120.0,
        num_replicas=replicas,
        storage=api.StorageType.FILE,
        placement=api.Placement(cluster=cluster),
    )
    try:
        await js.add_stream(config)
    except BadRequestError as err:
        if err.err_code != _STREAM_NAME_IN_USE:
            raise
        # The bucket exists with another configuration: use it as it is, say so.
        log.warning("kv_bucket_config_differs", bucket=bucket, cluster=cluster)
    return await js.key_value(bucket)
