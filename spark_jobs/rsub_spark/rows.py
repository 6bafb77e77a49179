"""The rows of the `rsub` source: Spark schema and the conversion of messages to Arrow."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from nats.aio.msg import Msg
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sidecar.nats.names import SOURCE_HEADER, VirtualStream

# Publishers may set this header to the original publish time, as unix milliseconds or
# RFC 3339; without it (or when it does not parse) `timestamp` is the time the message was
# stored in this region's read stream.
PUBLISHED_AT_HEADER = "Rsub-Published-At"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def spark_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("subject", StringType(), nullable=False),
        StructField("data", BinaryType(), nullable=False),
        StructField("sequence", LongType(), nullable=False),
        StructField("origin_region", StringType(), nullable=True),
        StructField("origin_sequence", LongType(), nullable=True),
        StructField("timestamp", TimestampType(), nullable=False),
    ]
    if include_headers:
        fields.append(
            StructField("headers", MapType(StringType(), StringType(), False), nullable=True)
        )
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for `schema` (it checks batches for equality)."""
    return to_arrow_schema(schema, timezone="UTC")


def published_at_micros(value: str) -> int | None:
    """Unix microseconds of a `Rsub-Published-At` value, or None when it does not parse."""
    text = value.strip()
    if text.isdigit():
        return int(text) * 1000
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return (parsed - _EPOCH) // _MICROSECOND


def to_record_batch(
    msgs: Sequence[Msg], origins: VirtualStream | None, schema: pa.Schema
) -> pa.RecordBatch:
    """One Arrow batch of rows for `msgs` (in schema order; headers only if the schema has them)."""
    subjects: list[str] = []
    datas: list[bytes] = []
    seqs: list[int] = []
    origin_regions: list[str | None] = []
    origin_seqs: list[int | None] = []
    stamps: list[int] = []
    headers: list[list[tuple[str, str]] | None] = []
    with_headers = schema.get_field_index("headers") >= 0
    for msg in msgs:
        meta = msg.metadata
        hdrs = msg.headers or {}
        subjects.append(msg.subject)
        datas.append(msg.data)
        seqs.append(meta.sequence.stream)
        source = hdrs.get(SOURCE_HEADER)
        origin = origins.origin_of(source) if origins is not None and source else None
        origin_regions.append(origin[0] if origin else None)
        origin_seqs.append(origin[1] if origin else None)
        published = hdrs.get(PUBLISHED_AT_HEADER)
        stamp = published_at_micros(published) if published else None
        stamps.append(stamp if stamp is not None else (meta.timestamp - _EPOCH) // _MICROSECOND)
        if with_headers:
            headers.append(list(hdrs.items()) if hdrs else None)
    columns: dict[str, Sequence[object]] = {
        "subject": subjects,
        "data": datas,
        "sequence": seqs,
        "origin_region": origin_regions,
        "origin_sequence": origin_seqs,
        "timestamp": stamps,
        "headers": headers,
    }
    arrays = [pa.array(columns[field.name], type=field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
