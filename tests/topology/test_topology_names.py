"""Unit tests of the naming contract (no server needed)."""

from __future__ import annotations

import pytest

from sidecar.naming import NamingError, VirtualStream, region_in_stream

# Header values recorded on nats-server 2.15.1 (see docs/topology.md): a source with two
# subject transforms (data rename + marker pass-through), and a walkthrough-style filter.
HDR_TRANSFORMS = (
    "orders-write-east 17 orders.east.>\f_rsub.orders.marker.east "
    "orders.>\f_rsub.orders.marker.east orders.east.a.b UtEAuh5y"
)
HDR_FILTER = "orders-write-west 3 orders.west.> > orders.west.x WWR8jvrr"


def vs(**kw: object) -> VirtualStream:
    args: dict[str, object] = {"name": "orders", "regions": ("west", "central", "east")}
    args.update(kw)
    return VirtualStream(**args)  # type: ignore[arg-type]


def test_names_and_subjects() -> None:
    v = vs()
    assert v.write_stream("west") == "orders-write-west"
    assert v.read_stream("east") == "orders-read-east"
    assert v.data_subject("central") == "orders.central.>"
    assert v.publish_subject("west", "eu.item") == "orders.west.eu.item"
    assert v.marker_subject("east") == "_rsub.orders.marker.east"
    assert v.snapshot_subject("west") == "_rsub.orders.snapshot.west"
    assert v.marker_filter() == "_rsub.orders.>"
    assert v.data_filter() == "orders.>"


def test_custom_patterns() -> None:
    v = vs(write_pattern="W_{region}_{name}", read_pattern="R_{region}_{name}")
    assert v.write_stream("west") == "W_west_orders"
    assert v.read_stream("west") == "R_west_orders"
    assert v.region_of_write_stream("W_east_orders") == "east"
    assert v.region_of_write_stream("R_east_orders") is None


def test_regions_list_is_a_tuple() -> None:
    assert vs(regions=["a", "b"]).regions == ("a", "b")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"name": "or.ders"}, "name"),
        ({"name": "or*"}, "name"),
        ({"name": "a>"}, "name"),
        ({"name": "a b"}, "name"),
        ({"name": ""}, "name"),
        ({"name": "_orders"}, "name"),
        ({"name": "-orders"}, "name"),
        ({"regions": ()}, "regions"),
        ({"regions": ("west", "west")}, "regions"),
        ({"regions": ("we.st",)}, "regions"),
        ({"regions": ("",)}, "regions"),
        ({"write_pattern": "{name}-w"}, "write_pattern"),
        ({"read_pattern": "{name}.{region}"}, "read_pattern"),
        ({"read_pattern": "{name}-write-{region}"}, "read_pattern"),
        ({"write_pattern": "{name}-{region}-{x}"}, "write_pattern"),
    ],
)
def test_invalid_definitions_name_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(NamingError, match=f"^{field}:"):
        vs(**kw)


def test_naming_error_is_a_value_error() -> None:
    assert issubclass(NamingError, ValueError)


def test_unknown_region_and_bad_suffix() -> None:
    v = vs()
    with pytest.raises(NamingError, match="region: 'north'"):
        v.write_stream("north")
    for suffix in ("", "a..b", "a.*", "a >", "a."):
        with pytest.raises(NamingError, match="suffix"):
            v.publish_subject("west", suffix)


def test_origin_of_recorded_headers() -> None:
    v = vs()
    assert v.origin_of(HDR_TRANSFORMS) == ("east", 17)
    assert v.origin_of(HDR_FILTER) == ("west", 3)
    # A source in another domain: the origin stream carries a hash of its API prefix.
    assert v.origin_of("orders-write-east:Zs0kQ0Ib 5 orders.east.> > orders.east.a x") == (
        "east",
        5,
    )


@pytest.mark.parametrize(
    "header",
    [
        "",
        "orders-write-west",
        "orders-write-north 3 orders.north.> > orders.north.x abc",
        "other-write-west 3 other.west.> > other.west.x abc",
        "orders-write-west x orders.west.> > orders.west.x abc",
        "orders-write-west 0 orders.west.> > orders.west.x abc",
        "$JS.ACK.orders-write-west.JS_SRC.1.3.3.0.0",
    ],
)
def test_origin_of_foreign_or_malformed(header: str) -> None:
    assert vs().origin_of(header) is None


@pytest.mark.parametrize(
    ("pattern", "stream", "region"),
    [
        ("{name}-write-{region}", "orders-write-east", "east"),
        ("w_{region}_{name}", "w_us-1_orders", "us-1"),
        ("{region}-{name}-{region}", "eu-orders-eu", "eu"),
        ("{name}-write-{region}", "orders-read-east", None),
        ("{name}-write-{region}", "billing-write-east", None),
        ("{region}-{name}-{region}", "eu-orders-us", None),
    ],
)
def test_region_in_stream_inverts_the_pattern(
    pattern: str, stream: str, region: str | None
) -> None:
    assert region_in_stream(pattern, "orders", stream) == region
