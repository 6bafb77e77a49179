"""configure_logging: JSON lines off a terminal, console rendering on one, stdlib routed too."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from sidecar.logs import configure_logging


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
    logging.captureWarnings(False)


def json_lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_auto_is_json_when_not_a_terminal() -> None:
    out = io.StringIO()
    configure_logging("auto", "info", stream=out)
    structlog.get_logger("sidecar.runtime").info("snapshot_completed", stream="orders", seq=42)
    logging.getLogger("nats.aio.client").warning("reconnecting to %s", "nats://a:4222")
    ours, library = json_lines(out)
    assert ours["event"] == "snapshot_completed"
    assert (ours["stream"], ours["seq"]) == ("orders", 42)
    assert (ours["level"], ours["logger"]) == ("info", "sidecar.runtime")
    assert str(ours["timestamp"]).endswith("Z") and "T" in str(ours["timestamp"])
    assert library["event"] == "reconnecting to nats://a:4222"
    assert (library["level"], library["logger"]) == ("warning", "nats.aio.client")
    assert "timestamp" in library


def test_auto_is_console_on_a_terminal() -> None:
    out = FakeTerminal()
    configure_logging("auto", "info", stream=out)
    structlog.get_logger("sidecar.api").info("listening", port=7070)
    logging.getLogger("aiohttp.access").info("GET /healthz 200")
    text = out.getvalue()
    lines = text.splitlines()
    assert len(lines) == 2
    assert not text.lstrip().startswith("{")
    assert "listening" in lines[0] and "port" in lines[0] and "7070" in lines[0]
    assert "sidecar.api" in lines[0] and "info" in lines[0]
    assert "GET /healthz 200" in lines[1] and "aiohttp.access" in lines[1]


def test_explicit_format_beats_detection() -> None:
    terminal = FakeTerminal()
    configure_logging("json", "info", stream=terminal)
    structlog.get_logger("x").info("hello")
    assert json_lines(terminal)[0]["event"] == "hello"
    pipe = io.StringIO()
    configure_logging("console", "info", stream=pipe)
    structlog.get_logger("x").info("hello")
    assert "hello" in pipe.getvalue() and not pipe.getvalue().startswith("{")


def test_level_filters_both_paths() -> None:
    out = io.StringIO()
    configure_logging("json", "warning", stream=out)
    structlog.get_logger("a").info("hidden")
    logging.getLogger("grpc").info("hidden too")
    structlog.get_logger("a").error("shown")
    assert [line["event"] for line in json_lines(out)] == ["shown"]


def test_idempotent_no_duplicate_lines_and_reconfigurable() -> None:
    out = io.StringIO()
    log = structlog.get_logger("early")  # made before configuration, as at import time
    configure_logging("json", "info", stream=out)
    configure_logging("json", "info", stream=out)
    log.info("once")
    assert len(json_lines(out)) == 1
    configure_logging("json", "debug", stream=out)
    log.debug("now visible")
    assert [line["event"] for line in json_lines(out)] == ["once", "now visible"]


def test_exceptions_are_structured_in_json() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger("a").exception("failed")
    (line,) = json_lines(out)
    assert line["event"] == "failed"
    assert "boom" in json.dumps(line["exception"])


def test_warnings_are_captured() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    (line,) = json_lines(out)
    assert line["logger"] == "py.warnings" and "deprecated thing" in str(line["event"])


@pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("json", "loud")])
def test_bad_arguments_name_the_key(fmt: str, level: str) -> None:
    with pytest.raises(ValueError, match=r"log\.(format|level)"):
        configure_logging(fmt, level)  # type: ignore[arg-type]


def test_json_tracebacks_never_carry_local_variables() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)

    def connect(password: str) -> None:
        raise ConnectionError(f"refused after {len(password)} characters")

    try:
        connect("hunter2-secret")
    except ConnectionError:
        structlog.get_logger("sidecar.nats").exception("connect_failed")
    [line] = json_lines(out)
    assert "ConnectionError" in json.dumps(line["exception"])
    assert "hunter2-secret" not in out.getvalue()
