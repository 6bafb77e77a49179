"""rsub's PySpark consumer plugin: the `rsub` Python data source over a region's read stream.

from spark_jobs import rsub_spark
rsub_spark.register(spark)
df = spark.readStream.format("rsub").options(**opts).load()
rsub_spark.attach_cursor_commits(spark, opts)
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from sidecar.api.client import CursorCommitError, SidecarClient, SidecarError
from spark_jobs.rsub_spark.cursor import sidecar_client
from spark_jobs.rsub_spark.listener import CursorCommitListener, attach_cursor_commits
from spark_jobs.rsub_spark.nats_read import RsubDataLossError, RsubReadError
from spark_jobs.rsub_spark.options import RsubOptionError, RsubOptions, parse_options
from spark_jobs.rsub_spark.rows import PUBLISHED_AT_HEADER, spark_schema
from spark_jobs.rsub_spark.source import RsubCheckpointError, RsubDataSource


def register(spark: SparkSession) -> None:
    """Makes `format("rsub")` available in `spark`."""
    spark.dataSource.register(RsubDataSource)


__all__ = [
    "PUBLISHED_AT_HEADER",
    "CursorCommitError",
    "CursorCommitListener",
    "RsubCheckpointError",
    "RsubDataLossError",
    "RsubDataSource",
    "RsubOptionError",
    "RsubOptions",
    "RsubReadError",
    "SidecarClient",
    "SidecarError",
    "attach_cursor_commits",
    "parse_options",
    "register",
    "sidecar_client",
    "spark_schema",
]
