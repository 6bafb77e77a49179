"""What every settings section shares: its error, its field checks, and checking itself.

A section is a frozen dataclass deriving from `Section`: a field's meaning and check sit in
its metadata (`setting`), a rule spanning several fields in the section's `_check`, and the
section runs both whenever it is built, from a file, the environment, command-line flags or
Spark options alike (`ConfigError` if any fails). Each front end renders the key its own way.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from sidecar.config.secrets import hide_userinfo

Check = Callable[[Any], str | None]
"""A field's check: takes the converted value, returns a problem or None."""

Problem = tuple[str, str]
"""(key path, problem)."""


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one `key.path: problem` line each, with
    any URL user info hidden (a problem may quote a server URL), and `keyed` the same as
    (key path, problem) pairs for a front end that names its keys otherwise."""

    def __init__(
        self, problems: list[str], source: str | None = None, keyed: Iterable[Problem] = ()
    ) -> None:
        self.problems = [hide_userinfo(problem) for problem in problems]
        self.keyed = tuple((key, hide_userinfo(problem)) for key, problem in keyed)
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"invalid configuration{where} ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n  ".join([header, *self.problems]))

    @classmethod
    def of(cls, keyed: Iterable[Problem]) -> ConfigError:
        items = list(keyed)
        return cls([f"{key}: {problem}" for key, problem in items], keyed=items)


def setting(
    meaning: str,
    check: Check | None = None,
    json: Mapping[str, Any] | None = None,
    *,
    kind: str | None = None,
) -> dict[str, Any]:
    """A field's metadata: what it means, and what kind of value it takes when its type says
    less (`kind`: "list of URLs" for a tuple of strings), for the reference table of
    docs/configuration.md; its check; and what the check allows as JSON Schema keywords
    beyond the field's type (`json`), for the chart's values schema. `scripts/config_schema.py`
    writes both from here, so the docs, the chart and the sidecar say the same."""
    return {"meaning": meaning, "kind": kind, "check": check, "json": json or {}}


POSITIVE = {"exclusiveMinimum": 0}
NOT_NEGATIVE = {"minimum": 0}


def positive_setting(meaning: str) -> dict[str, Any]:
    """The metadata of a number that must be positive (`setting`)."""
    return setting(meaning, positive, POSITIVE)


def problems_in(section: type, values: Mapping[str, Any]) -> list[Problem]:
    """The problems of `section` built from `values` (absent keys unchecked): each field's
    check, then the section's rules over the keys that passed theirs."""
    found: list[Problem] = []
    passed = dict(values)
    for f in dataclasses.fields(section):
        check: Check | None = f.metadata.get("check")
        value = values.get(f.name)
        if check is not None and value is not None and (problem := check(value)):
            found.append((f.name, problem))
            del passed[f.name]
    rules: Callable[[Mapping[str, Any]], Iterator[Problem]] | None = getattr(
        section, "_check", None
    )
    if rules is not None:
        found.extend(rules(passed))
    return found


class Section:
    """A settings section that checks itself when built (see the module's docstring)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        found = problems_in(type(self), values)
        if found:
            raise ConfigError.of(found)


def optional_inner(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


class Collector:
    """Problems found so far while loading, each as (key path, problem)."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, path: str, problem: str) -> None:
        self.items.append((path, problem))


def positive(value: float) -> str | None:
    return None if value > 0 else f"must be positive, got {value}"


def not_negative(value: float) -> str | None:
    return None if value >= 0 else f"must not be negative, got {value}"


def existing_file(path: Path) -> str | None:
    return None if path.is_file() else f"file not found: {path}"


def cert_and_key(v: Mapping[str, Any]) -> Iterator[Problem]:
    """A certificate and its key come together."""
    if (v.get("cert_file") is None) != (v.get("key_file") is None):
        key = "key_file" if v.get("key_file") is None else "cert_file"
        yield key, "cert_file and key_file must be set together"
