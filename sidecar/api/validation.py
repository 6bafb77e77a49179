"""Request field checks done before the backend is called."""

from __future__ import annotations

from sidecar.naming import NamingError, check_token
from sidecar.runtime.errors import InvalidArgument

# JetStream's limit for stream and consumer names.
MAX_NAME_LENGTH = 255


def require_name(field: str, value: str) -> str:
    """Check a stream or subscription name; raise `InvalidArgument` naming `field`."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(field, f"must be at most {MAX_NAME_LENGTH} characters")
    try:
        return check_token(field, value)
    except NamingError as error:
        # NamingError's message already starts with "<field>: ".
        raise InvalidArgument(field, str(error).removeprefix(f"{field}: ")) from error
