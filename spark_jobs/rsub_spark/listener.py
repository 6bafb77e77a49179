"""Reports each committed micro-batch of an `rsub` source to the sidecar as a cursor commit.

The engine calls a source's `commit()` one batch late and never for the last batch of an
`availableNow` run; a query progress event, by contrast, is posted for every batch once the
sink committed it. So the commits hang off `StreamingQueryListener.onQueryProgress`, which
runs in the driver's Python process.

A commit that does not take effect is logged and counted by the client
(`rsub.cursor_commit_failed`, `commit_failures`); the listener keeps it as `failure` until a
later commit covers it (cursors are cumulative), and `wait_for` raises it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import structlog
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery

from sidecar.api.client import CursorCommitError
from spark_jobs.rsub_spark.cursor import check_cursor, sidecar_client
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions, parse_options

log = structlog.get_logger(__name__)


def end_sequence(end_offset: str | None, read_stream: str) -> int | None:
    """The sequence of an rsub end offset (progress JSON) of `read_stream`, else None."""
    if not end_offset:
        return None
    try:
        parsed = json.loads(end_offset)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or parsed.get("stream") != read_stream:
        return None
    sequence = parsed.get("sequence")
    return sequence if isinstance(sequence, int) else None


class CursorCommitListener(StreamingQueryListener):
    """Commits the end sequence of every batch that read `opts.read_stream` to the sidecar."""

    def __init__(self, opts: RsubOptions, query_name: str | None = None) -> None:
        if opts.sidecar is None or opts.subscription is None:
            raise RsubOptionError("cursor commits need the options sidecar and subscription")
        self._stream = opts.stream
        self._read_stream = opts.read_stream
        self._subscription = opts.subscription
        self._query_name = query_name
        self._client = sidecar_client(opts)
        try:
            check_cursor(self._client, opts.stream, opts.subscription)
        except Exception:
            self._client.close()
            raise
        self._committed = 0
        self._failure: CursorCommitError | None = None
        self._changed = threading.Condition()

    @property
    def committed(self) -> int:
        """The highest sequence the sidecar acknowledged through this listener (0: none)."""
        with self._changed:
            return self._committed

    @property
    def commit_failures(self) -> int:
        """Commits that did not take effect so far (a counter, for the job's own metrics)."""
        return self._client.commit_failures

    @property
    def failure(self) -> CursorCommitError | None:
        """The last commit that did not take effect, until a commit of as far or further does."""
        with self._changed:
            return self._failure

    def wait_for(self, sequence: int, timeout_s: float) -> bool:
        """Blocks until a commit >= `sequence` went through; False after `timeout_s`.

        Raises `CursorCommitError` once the commit of a batch ending at or after `sequence`
        failed for good (and nothing since committed that far).
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._committed < sequence:
                if self._failure is not None and self._failure.sequence >= sequence:
                    raise self._failure
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def wait_for_query(self, query: StreamingQuery, timeout_s: float) -> bool:
        """Blocks until the end of `query`'s last reported batch is committed (e.g. at exit)."""
        progress: dict[str, Any] = query.lastProgress or {}
        ends = [
            end_sequence(source.get("endOffset"), self._read_stream)
            for source in progress.get("sources", [])
        ]
        known = [end for end in ends if end is not None]
        return self.wait_for(max(known), timeout_s) if known else True

    def onQueryStarted(self, event: Any) -> None:
        return None

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self._query_name is not None and progress.name != self._query_name:
            return
        for source in progress.sources:
            sequence = end_sequence(source.endOffset, self._read_stream)
            if sequence is None or sequence <= self.committed:
                continue
            try:
                self._client.commit_with_retries(self._stream, self._subscription, sequence)
            except CursorCommitError as error:
                # Logged and counted by the client; a later batch's commit covers it (cursors
                # are cumulative), and until then `wait_for` raises it.
                with self._changed:
                    self._failure = error
                    self._changed.notify_all()
                continue
            log.debug(
                "rsub.cursor_committed",
                stream=self._stream,
                subscription=self._subscription,
                sequence=sequence,
                batch=progress.batchId,
            )
            with self._changed:
                self._committed = max(self._committed, sequence)
                if self._failure is not None and self._failure.sequence <= self._committed:
                    self._failure = None
                self._changed.notify_all()

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        return None


def attach_cursor_commits(
    spark: SparkSession, options: Mapping[str, str], query_name: str | None = None
) -> CursorCommitListener:
    """Registers a listener committing the batches of rsub reads made with `options`.

    `options` are the ones given to `spark.readStream.format("rsub")` (they must name the
    sidecar and the subscription). With `query_name`, only that query's progress counts.
    Raises `RsubOptionError` at once when the subscription is a durable consumer (commits go
    to an external cursor: `cursor.check_cursor`).
    """
    listener = CursorCommitListener(parse_options(options), query_name)
    spark.streams.addListener(listener)
    return listener
