"""Option parsing, partition splitting and row helpers of the rsub source (pure, no I/O)."""

from __future__ import annotations

import re

import pytest

from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM
from spark_jobs.rsub_spark.options import (
    EndingOffsets,
    RsubOptionError,
    StartingOffsets,
    parse_options,
)
from spark_jobs.rsub_spark.rows import published_at_micros, spark_schema
from spark_jobs.rsub_spark.source import NO_PROGRESS, split_range

BASE = {"servers": "nats://a:4222, nats://b:4222", "stream": "orders", "region": "west"}


def test_defaults_and_read_stream_name() -> None:
    opts = parse_options(BASE)
    assert opts.nats.servers == ("nats://a:4222", "nats://b:4222")
    assert opts.read_stream == "orders-read-west"
    assert opts.data_filter == "orders.>"
    assert opts.starting is None
    assert opts.starting_for(streaming=True) == StartingOffsets("latest")
    assert opts.starting_for(streaming=False) == StartingOffsets("earliest")
    assert opts.ending == EndingOffsets("latest")
    assert opts.fail_on_data_loss and not opts.include_headers
    assert opts.max_offsets_per_trigger is None


def test_subscription_is_the_default_start_when_a_sidecar_is_named() -> None:
    opts = parse_options({**BASE, "subscription": "billing", "sidecar": "h:7070"})
    assert opts.starting_for(streaming=True) == StartingOffsets("subscription")


def test_option_names_are_case_insensitive_like_spark() -> None:
    opts = parse_options(
        {
            "SERVERS": "nats://a:4222",
            "stream": "orders",
            "readstream": "custom-read",
            "startingoffsets": '{"sequence": 17}',
            "MaxOffsetsPerTrigger": "100",
            "includeheaders": "TRUE",
            "failondataloss": "false",
        }
    )
    assert opts.read_stream == "custom-read"
    assert opts.starting == StartingOffsets("sequence", 17)
    assert opts.max_offsets_per_trigger == 100
    assert opts.include_headers and not opts.fail_on_data_loss


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"startingOffset": "earliest"}, "unknown option 'startingOffset'"),
        ({"startingOffsets": "oldest"}, "option startingOffsets"),
        ({"startingOffsets": '{"sequence": 0}'}, "option startingOffsets"),
        ({"startingOffsets": '{"seq": 5}'}, "option startingOffsets"),
        ({"startingOffsets": "subscription"}, "needs the options subscription and sidecar"),
        ({"endingOffsets": "earliest"}, "option endingOffsets"),
        ({"maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger: must be >= 1"),
        ({"maxOffsetsPerTrigger": "many"}, "option maxOffsetsPerTrigger: expected an integer"),
        ({"includeHeaders": "maybe"}, "option includeHeaders"),
        ({"stream": "or.ders"}, "option stream"),
        ({"region": "we st"}, "option region"),
        (
            {"token": "t", "user": "u", "password": "p"},
            "option token: choose one authentication method, got user/password and token",
        ),
        ({"user": "u"}, "option password: user and password must be set together"),
        ({"password": "p"}, "option user: user and password must be set together"),
    ],
)
def test_bad_options_are_named(extra: dict[str, str], needle: str) -> None:
    with pytest.raises(RsubOptionError, match=re.escape(needle)):
        parse_options({**BASE, **extra})


@pytest.mark.parametrize("missing", ["servers", "stream"])
def test_required_options(missing: str) -> None:
    given = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(RsubOptionError, match=f"option {missing} is required"):
        parse_options(given)


def test_region_or_read_stream_is_required() -> None:
    with pytest.raises(RsubOptionError, match="option region is required"):
        parse_options({"servers": "nats://a:4222", "stream": "orders"})


def test_split_range_covers_the_range_exactly() -> None:
    opts = parse_options({**BASE, "maxRecordsPerPartition": "30", "minPartitions": "2"})
    parts = split_range(opts, 10, 110, NO_PROGRESS)
    assert [(p.start, p.end) for p in parts] == [(10, 35), (35, 60), (60, 85), (85, 110)]
    assert split_range(opts, 10, 10, NO_PROGRESS) == []
    assert [(p.start, p.end) for p in split_range(opts, 10, 11, NO_PROGRESS)] == [(10, 11)]


def test_published_at_header_formats() -> None:
    assert published_at_micros("1700000000123") == 1_700_000_000_123_000
    assert published_at_micros("2024-05-06T07:08:09.123456789Z") == 1_714_979_289_123_456
    assert published_at_micros("2024-05-06T09:08:09+02:00") == 1_714_979_289_000_000
    assert published_at_micros("2024-05-06T07:08:09") is None  # no zone: ambiguous
    assert published_at_micros("yesterday") is None


def test_schema_has_headers_only_when_asked() -> None:
    assert spark_schema(False).fieldNames() == [
        "subject",
        "data",
        "sequence",
        "origin_region",
        "origin_sequence",
        "timestamp",
    ]
    assert spark_schema(True).fieldNames()[-1] == "headers"


def test_write_stream_pattern_defaults_to_the_naming_contract() -> None:
    assert parse_options(BASE).write_stream_pattern == DEFAULT_WRITE_STREAM
    custom = parse_options({**BASE, "writeStreamPattern": "w_{region}_{name}"})
    assert custom.write_stream_pattern == "w_{region}_{name}"
    assert custom.read_stream == "orders-read-west"


@pytest.mark.parametrize(
    "pattern", ["{name}-write", "{name}.w.{region}", "{name}-read-{region}", "{nme}-{region}"]
)
def test_bad_write_stream_patterns_are_named(pattern: str) -> None:
    with pytest.raises(RsubOptionError, match="option writeStreamPattern"):
        parse_options({**BASE, "writeStreamPattern": pattern})


def test_write_stream_pattern_is_checked_without_a_region() -> None:
    given = {"servers": "nats://a:4222", "stream": "orders", "readStream": "r"}
    with pytest.raises(RsubOptionError, match="option writeStreamPattern"):
        parse_options({**given, "writeStreamPattern": "{name}"})


def test_read_stream_pattern_names_the_read_stream() -> None:
    custom = parse_options({**BASE, "readStreamPattern": "{name}_all_{region}"})
    assert custom.read_stream == "orders_all_west"
    # Swapped defaults are still a valid pair of distinct names.
    swapped = {"writeStreamPattern": DEFAULT_READ_STREAM, "readStreamPattern": DEFAULT_WRITE_STREAM}
    assert parse_options({**BASE, **swapped}).read_stream == "orders-write-west"


@pytest.mark.parametrize("pattern", ["{name}-r", "{name} {region}", "{name}-write-{region}"])
def test_bad_read_stream_patterns_are_named(pattern: str) -> None:
    with pytest.raises(RsubOptionError, match="option readStreamPattern"):
        parse_options({**BASE, "readStreamPattern": pattern})


def test_read_stream_and_its_pattern_exclude_each_other() -> None:
    given = {**BASE, "readStream": "r", "readStreamPattern": "{name}_all_{region}"}
    with pytest.raises(RsubOptionError, match="readStream and readStreamPattern exclude"):
        parse_options(given)


def test_credentials_never_show_in_the_options_repr() -> None:
    secrets = {"password": "pw-s3cret-1", "sidecarToken": "tok-s3cret-2"}
    opts = parse_options({**BASE, "user": "svc", **secrets})
    shown = repr(opts) + str(opts)
    assert not any(secret in shown for secret in secrets.values())
    assert opts.nats.password is not None and opts.nats.password.reveal() == "pw-s3cret-1"
    token_only = parse_options({**BASE, "token": "nats-tok-s3cret-3"})
    assert "nats-tok-s3cret-3" not in repr(token_only)
    in_url = parse_options({**BASE, "servers": "nats://svc:url-s3cret-4@h:4222"})
    assert in_url.nats.servers == ("nats://svc:url-s3cret-4@h:4222",)
    assert "url-s3cret-4" not in repr(in_url) + str(in_url)
    assert "servers=('nats://***@h:4222',)" in repr(in_url)
