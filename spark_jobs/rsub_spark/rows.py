"""The rows of the `rsub` source: Spark schema and the conversion of messages to Arrow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
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

from sidecar.exact import covered
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.stream_reader import Stored, rfc3339_micros

# Publishers may set this header to the original publish time, as unix milliseconds or
# RFC 3339; without it (or when it does not parse) `timestamp` is the time the message was
# stored in this region's read stream.
PUBLISHED_AT_HEADER = "Rsub-Published-At"
# Headers a direct get adds to the stored message; not part of the message itself.
_DIRECT_GET_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
    }
)


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
    return rfc3339_micros(text)


def to_record_batch(
    records: Sequence[Stored],
    origins: VirtualStream | None,
    schema: pa.Schema,
    progress: Mapping[str, int],
) -> pa.RecordBatch:
    """One Arrow batch of rows (in schema order; headers only if the schema has them),
    leaving out the messages `progress` covers (consumed somewhere, `sidecar.exact`)."""
    subjects: list[str] = []
    datas: list[bytes] = []
    seqs: list[int] = []
    origin_regions: list[str | None] = []
    origin_seqs: list[int | None] = []
    stamps: list[int] = []
    headers: list[list[tuple[str, str]] | None] = []
    with_headers = schema.get_field_index("headers") >= 0
    for seq, subject, data, hdrs, stored in records:
        source = hdrs.get(SOURCE_HEADER) if hdrs else None
        origin = origins.origin_of(source) if origins is not None and source else None
        if covered(origin, progress):
            continue
        subjects.append(subject)
        datas.append(data)
        seqs.append(seq)
        origin_regions.append(origin[0] if origin else None)
        origin_seqs.append(origin[1] if origin else None)
        published = hdrs.get(PUBLISHED_AT_HEADER) if hdrs else None
        stamp = published_at_micros(published) if published else None
        stamps.append(stored if stamp is None else stamp)
        if with_headers:
            kept = [(k, v) for k, v in hdrs.items() if k not in _DIRECT_GET_HEADERS] if hdrs else []
            headers.append(kept or None)
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
