"""The `rsub` Python data source: batch and streaming reads of one region's read stream.

Offsets are `{"stream": <read stream>, "sequence": N}`: everything up to and including
read-stream sequence N is part of the batches so far. A micro-batch from offset `a` to `b`
reads exactly the data messages with `a < sequence <= b`, except those covered by the
offsets' `"progress"`: a query that continues a subscription (`startingOffsets=subscription`)
reads the subscription's progress vector once at its start and carries it in every offset
(so in its checkpoint), leaving out the messages consumed elsewhere (`sidecar.exact`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pyarrow as pa
import structlog
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from sidecar.exact import Progress
from spark_jobs.rsub_spark.cursor import cursor_position, sidecar_client
from spark_jobs.rsub_spark.nats_read import (
    NatsSession,
    RsubDataLossError,
    StreamBounds,
    iterate_range,
    stream_bounds,
)
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions, parse_options
from spark_jobs.rsub_spark.rows import arrow_schema, spark_schema, to_record_batch

log = structlog.get_logger(__name__)


NO_PROGRESS = Progress({}, {})
"""A read that continues no subscription: nothing left out."""


class RsubCheckpointError(RuntimeError):
    """A checkpointed offset does not belong to the read stream this query reads."""


class SequenceRange(InputPartition):
    """The read-stream sequences `start < s <= end`, read by one Spark task, without the
    messages `progress` covers."""

    def __init__(self, start: int, end: int, progress: Progress) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end
        self.progress = progress


def split_range(opts: RsubOptions, start: int, end: int, progress: Progress) -> list[SequenceRange]:
    """Cuts `(start, end]` into at least minPartitions ranges of <= maxRecordsPerPartition."""
    span = end - start
    if span <= 0:
        return []
    count = max(opts.min_partitions, math.ceil(span / opts.max_records_per_partition))
    count = min(count, span)
    bounds = [start + span * i // count for i in range(count + 1)]
    return [SequenceRange(lo, hi, progress) for lo, hi in itertools.pairwise(bounds)]


def read_range_batches(
    opts: RsubOptions, schema: StructType, part: SequenceRange
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the data messages of `part`; logs how many rows its vector dropped."""
    pa_schema = arrow_schema(schema)
    dropped = 0
    for msgs, bounds in iterate_range(opts, part.start, part.end):
        batch = to_record_batch(msgs, bounds.origins, pa_schema, part.progress)
        dropped += len(msgs) - batch.num_rows
        yield batch
    if dropped:
        log.info(
            "rsub.covered_rows_dropped",
            read_stream=opts.read_stream,
            subscription=opts.subscription,
            start=part.start,
            end=part.end,
            rows=dropped,
        )


class Start(NamedTuple):
    """Where a new query or batch read starts: after sequence `after`, leaving out the
    messages `progress` covers (empty unless it continues a subscription)."""

    after: int
    progress: Progress


def start_of(opts: RsubOptions, streaming: bool, bounds: StreamBounds) -> Start:
    """Where a new query or batch read starts."""
    starting = opts.starting_for(streaming)
    if starting.kind == "earliest":
        return Start(bounds.first_seq - 1, NO_PROGRESS)
    if starting.kind == "latest":
        return Start(bounds.last_seq, NO_PROGRESS)
    if starting.kind == "sequence":
        return Start(starting.sequence - 1, NO_PROGRESS)
    assert opts.sidecar is not None and opts.subscription is not None  # checked by parse_options
    with sidecar_client(opts) as client:
        mark_delete, progress = cursor_position(client, opts.stream, opts.subscription)
    log.info(
        "rsub.start_from_subscription",
        stream=opts.stream,
        read_stream=opts.read_stream,
        subscription=opts.subscription,
        mark_delete=mark_delete,
        progress=dict(progress),
        acked=progress.acked,
    )
    return Start(mark_delete, progress)


def _checked_schema(opts: RsubOptions, schema: StructType) -> StructType:
    expected = spark_schema(opts.include_headers)
    if [(f.name, f.dataType) for f in schema] != [(f.name, f.dataType) for f in expected]:
        raise RsubOptionError(
            f"the rsub source produces the schema {expected.simpleString()}, "
            f"not {schema.simpleString()}"
        )
    return schema


def _read_partition(opts: RsubOptions, schema: StructType, partition: Any) -> Iterator[Any]:
    if isinstance(partition, SequenceRange):
        return read_range_batches(opts, schema, partition)
    return iter(())


class RsubStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: RsubOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = _checked_schema(opts, schema)
        self._session: NatsSession | None = None
        self._latest: tuple[float, int] | None = None
        self._initial: dict[str, Any] | None = None
        self._available_now_end: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    def _bounds(self) -> StreamBounds:
        if self._session is None:
            self._session = NatsSession(self._opts)
        opts = self._opts
        return self._session.run(lambda nc: stream_bounds(nc, opts))

    def _last_seq(self, fresh: bool = False) -> int:
        now = time.monotonic()
        max_age = self._opts.latest_offset_cache_ms / 1000
        if fresh or self._latest is None or now - self._latest[0] >= max_age:
            self._latest = (now, self._bounds().last_seq)
        return self._latest[1]

    def _offset(self, sequence: int, progress: Progress) -> dict[str, Any]:
        offset: dict[str, Any] = {"stream": self._opts.read_stream, "sequence": sequence}
        if progress:  # sorted: Spark compares offsets as JSON text
            offset["progress"] = dict(sorted(progress.items()))
        if progress.acked:
            acked = sorted(progress.acked.items())
            offset["acked"] = {region: [list(pair) for pair in pairs] for region, pairs in acked}
        return offset

    def _sequence_of(self, offset: dict[str, Any]) -> int:
        stream = offset.get("stream")
        if stream != self._opts.read_stream:
            raise RsubCheckpointError(
                f"the checkpoint holds an offset of read stream {stream!r}, but this query reads "
                f"{self._opts.read_stream!r}: sequences differ between regions, so start a new "
                "checkpoint (with startingOffsets=subscription to continue the subscription)"
            )
        return int(offset["sequence"])

    @staticmethod
    def _progress_of(offset: dict[str, Any]) -> Progress:
        vector = {str(region): int(seq) for region, seq in (offset.get("progress") or {}).items()}
        acked = {
            str(region): tuple((int(first), int(last)) for first, last in pairs)
            for region, pairs in (offset.get("acked") or {}).items()
        }
        return Progress(vector, acked)

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks twice on a fresh start; "latest" must answer the same both times.
        if self._initial is None:
            self._initial = self._offset(*start_of(self._opts, True, self._bounds()))
        return self._initial

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = self._sequence_of(start)
        latest = self._last_seq()
        if latest < begin:  # the cached answer may predate `begin`: ask again before failing
            latest = self._last_seq(fresh=True)
        if latest < begin and self._opts.fail_on_data_loss:
            raise RsubDataLossError(
                f"read stream {self._opts.read_stream!r} ends at sequence {latest}, before the "
                f"offset {begin} this query reached: was the stream deleted and created again? "
                "(set failOnDataLoss=false to wait for the stream to pass the offset)"
            )
        if self._available_now_end is not None:
            latest = min(latest, self._available_now_end)
        if isinstance(limit, ReadMaxRows):
            latest = min(latest, begin + limit.max_rows)
        return self._offset(max(begin, latest), self._progress_of(start))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._opts.max_offsets_per_trigger)

    def reportLatestOffset(self) -> dict[str, Any]:
        return self._offset(self._last_seq(), NO_PROGRESS)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = self._last_seq(fresh=True)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SequenceRange]:
        return split_range(
            self._opts, self._sequence_of(start), self._sequence_of(end), self._progress_of(start)
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self._opts, self._schema, partition)

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


class RsubBatchReader(DataSourceReader):
    def __init__(self, opts: RsubOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = _checked_schema(opts, schema)

    def partitions(self) -> list[SequenceRange]:
        opts = self._opts
        session = NatsSession(opts)
        try:
            bounds = session.run(lambda nc: stream_bounds(nc, opts))
        finally:
            session.close()
        start = start_of(opts, False, bounds)
        end = bounds.last_seq
        if opts.ending.kind == "sequence":
            end = min(end, opts.ending.sequence)
        return split_range(opts, start.after, end, start.progress)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self._opts, self._schema, partition)


class RsubDataSource(DataSource):
    """`spark.read.format("rsub")` / `spark.readStream.format("rsub")`."""

    @classmethod
    def name(cls) -> str:
        return "rsub"

    def _parsed(self) -> RsubOptions:
        return parse_options(self.options)

    def schema(self) -> StructType:
        return spark_schema(self._parsed().include_headers)

    def reader(self, schema: StructType) -> RsubBatchReader:
        return RsubBatchReader(self._parsed(), schema)

    def streamReader(self, schema: StructType) -> RsubStreamReader:
        if any(key.lower() == "endingoffsets" for key in self.options):
            raise RsubOptionError("option endingOffsets is for batch reads only (spark.read)")
        return RsubStreamReader(self._parsed(), schema)
