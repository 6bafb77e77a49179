"""Request field checks done before the backend is called."""

from __future__ import annotations

import re

from sidecar.api.errors import InvalidArgument

MAX_NAME_LENGTH = 255
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def require_name(field: str, value: str) -> str:
    """Check a stream or subscription name; raise `InvalidArgument` naming `field`."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(field, f"must be at most {MAX_NAME_LENGTH} characters")
    if not _NAME_RE.fullmatch(value):
        raise InvalidArgument(
            field,
            f"{value!r} is not a valid name: use letters, digits, '_' and '-', "
            "starting with a letter or digit",
        )
    return value
