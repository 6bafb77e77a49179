"""Secrets in settings: a string that never shows, and URLs shown without their user info."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# A URL's user info: from after `scheme://` (or the start of a scheme-less `user:pw@host`) to
# the last `@` before a blank, quote, comma or bracket (a password may hold a raw `@` or `/`).
_USERINFO_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)?[^\s'\",()\[\]{}<>]*@")


def hide_userinfo(text: str) -> str:
    """`text` with the user info of every URL in it (`nats://user:password@host`, also
    without a scheme) shown as `***`: server URLs may carry a password."""
    return _USERINFO_RE.sub(lambda m: f"{m[1] or ''}***@", text)


def repr_hiding_userinfo(self: Any) -> str:
    """A dataclass's repr, field by field as dataclasses write it, with URL user info hidden
    (`__repr__` of the dataclasses that hold server URLs, which may carry a password)."""
    shown = ", ".join(
        f"{f.name}={hide_userinfo(repr(getattr(self, f.name)))}"
        for f in dataclasses.fields(self)
        if f.repr
    )
    return f"{type(self).__qualname__}({shown})"


class Secret:
    """A string that never shows in `repr`, `str` or log output; `reveal()` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__
