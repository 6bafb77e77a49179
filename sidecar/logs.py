"""Logging setup: structlog for our code, stdlib logging routed through the same processors.

`configure_logging()` installs one handler on the root logger, so library logs (nats,
aiohttp, grpc, asyncio) come out in the same format as ours: JSON lines when the stream is
not a terminal (or `format="json"`), a readable console rendering on a terminal.
Calling it again replaces that handler: it never stacks a second one.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
import structlog.tracebacks
from structlog.typing import Processor

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]

_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class _RsubHandler(logging.StreamHandler[TextIO]):
    """The root handler installed by configure_logging (found again by its type)."""


def _shared_processors() -> list[Processor]:
    # Run for structlog events and, as foreign_pre_chain, for stdlib records.
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


# Tracebacks as JSON, without each frame's local variables: a local may hold a secret
# (a password, a token, a URL with credentials), and a log line must never carry one.
_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def configure_logging(
    format: LogFormat = "auto", level: str = "info", *, stream: TextIO | None = None
) -> None:
    """Set up structlog and stdlib logging; `stream` defaults to stdout."""
    if level.lower() not in _LEVELS:
        raise ValueError(f"log.level: unknown level {level!r}; expected one of {list(_LEVELS)}")
    if format not in ("auto", "json", "console"):
        raise ValueError(f"log.format: unknown format {format!r}; expected auto, json or console")
    out = sys.stdout if stream is None else stream
    use_json = format == "json" or (format == "auto" and not _is_terminal(out))
    renderer: list[Processor] = (
        [_TRACEBACKS, structlog.processors.JSONRenderer()]
        if use_json
        else [structlog.dev.ConsoleRenderer(colors=_is_terminal(out))]
    )
    shared = _shared_processors()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a second configure_logging() must reach loggers made at import time.
        cache_logger_on_first_use=False,
    )
    handler = _RsubHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RsubHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level.lower()])
    logging.captureWarnings(True)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
