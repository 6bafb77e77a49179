"""Pure unit tests of the topology planner's helpers (no server)."""

from __future__ import annotations

import pytest

from sidecar.cli.topology import format_report
from sidecar.naming import VirtualStream
from sidecar.nats.topology import (
    StreamReport,
    TopologyReport,
    _Plan,
    _resume_sources,
    subject_within,
    subjects_overlap,
)

VS = VirtualStream("foo", ("west", "east"))


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("foo.>", "foo.west.>", True),
        ("foo.west.>", "foo.east.>", False),
        ("foo.*.x", "foo.west.>", True),
        ("foo.*.x", "foo.west.y", False),
        ("foo", "foo.>", False),
        ("foo.a", "foo.a", True),
        ("foo.a", "foo.a.b", False),
        ("_rsub.foo.marker.west", "_rsub.foo.>", True),
        (">", "anything.at.all", True),
    ],
)
def test_subjects_overlap(a: str, b: str, overlap: bool) -> None:
    assert subjects_overlap(a, b) is overlap
    assert subjects_overlap(b, a) is overlap


@pytest.mark.parametrize(
    ("inner", "outer", "within"),
    [
        ("foo.west.>", "foo.west.>", True),
        ("foo.west.a.>", "foo.west.>", True),
        ("foo.west", "foo.west.>", False),
        ("foo.>", "foo.west.>", False),
        ("foo.*.a", "foo.*.a", True),
        ("foo.x.a", "foo.*.a", True),
        ("foo.>", "foo.*", False),
        ("foo.*", "foo.west", False),
    ],
)
def test_subject_within(inner: str, outer: str, within: bool) -> None:
    assert subject_within(inner, outer) is within


def plan(*origins: str) -> _Plan:
    return _Plan("foo-read-west", "west", "read", {}, {}, resume=list(origins))


def test_resume_after_last_sourced_message() -> None:
    p = plan("foo-write-west", "foo-write-east")
    sources = _resume_sources(VS, p, {"foo-write-west": 41}, {"first_seq": 1, "last_seq": 60})
    assert [(s["name"], s.get("opt_start_seq"), s.get("opt_start_time")) for s in sources] == [
        ("foo-write-west", 42, None),
        ("foo-write-east", None, None),
    ]
    assert sources[0]["subject_transforms"] == [
        {"src": "foo.west.>", "dest": "foo.>"},
        {"src": "_rsub.foo.marker.west", "dest": "_rsub.foo.marker.west"},
    ]
    assert p.notes == [
        "foo-write-west resumes at origin seq 42",
        "foo-write-east never sourced before: starts at its first message",
    ]


def test_resume_by_time_when_messages_were_removed() -> None:
    p = plan("foo-write-east")
    ts = "2026-01-01T00:00:00Z"
    [source] = _resume_sources(VS, p, {}, {"first_seq": 10, "last_seq": 20, "last_ts": ts})
    assert source["opt_start_time"] == ts and "opt_start_seq" not in source
    assert "no message left" in p.notes[0]


def test_format_report() -> None:
    report = TopologyReport(
        "foo",
        False,
        (
            StreamReport("foo-write-west", "west", "write", "unchanged"),
            StreamReport(
                "foo-read-west", "west", "read", "updated", ("subjects", "sources"), ("n1",)
            ),
        ),
    )
    assert format_report(report).splitlines() == [
        "virtual stream foo",
        "  write foo-write-west: unchanged",
        "  read  foo-read-west: updated (subjects, sources)",
        "        n1",
    ]
    assert report.changed and report.as_dict()["streams"][1]["fields"] == ["subjects", "sources"]
