"""Loading the sidecar's configuration: a YAML file plus `RSUB_*` environment overrides.

The loader walks the sections' type hints (`sidecar.config.schema`), so the schema is written
once. It collects every problem before failing and raises a single `ConfigError` whose lines
read `key.path: problem` (with the variable a value came from). Environment overrides are
`sidecar.config.environment`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from sidecar.config.checks import Collector, ConfigError, optional_inner, problems_in
from sidecar.config.environment import apply_env, yaml_problem
from sidecar.config.schema import Config
from sidecar.config.secrets import Secret


def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> Config:
    """Load the YAML file at `path` (or nothing, if None) and apply `RSUB_*` overrides."""
    data: object = {}
    source = str(path) if path is not None else None
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError([f"<file>: cannot read: {exc.strerror or exc}"], source) from exc
        except UnicodeDecodeError as exc:
            problem = f"<file>: not UTF-8 text: byte {exc.object[exc.start]:#04x} at {exc.start}"
            raise ConfigError([problem], source) from exc
        except yaml.YAMLError as exc:
            raise ConfigError([f"<file>: not valid YAML: {yaml_problem(exc)}"], source) from exc
        if data is None:
            data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            [f"<file>: top level must be a mapping, got {type(data).__name__}"], source
        )
    return _build(data, env, source)


_INVALID = object()


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _build(data: Mapping[str, Any], env: Mapping[str, str], source: str | None) -> Config:
    problems = Collector()
    merged, env_paths = apply_env(dict(data), env, problems)
    config = _convert(merged, Config, "", problems)
    if problems.items:
        raise ConfigError(
            [_render(path, problem, env_paths) for path, problem in problems.items],
            source,
            keyed=problems.items,
        )
    assert isinstance(config, Config)
    return config


def _render(path: str, problem: str, env_paths: Mapping[str, str]) -> str:
    for env_path, var in env_paths.items():
        if path == env_path or path.startswith((env_path + ".", env_path + "[")):
            return f"{path}: {problem} (from {var})"
    return f"{path or '<top level>'}: {problem}"


def _convert(value: object, tp: Any, path: str, problems: Collector) -> Any:
    """Convert `value` to `tp`, recording problems under `path`; _INVALID on failure."""
    inner = optional_inner(tp)
    if inner is not None:
        return None if value is None else _convert(value, inner, path, problems)
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        return _convert_section(value, tp, path, problems)
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        problems.add(path, f"must be one of {', '.join(choices)}; got {value!r}")
        return _INVALID
    if origin is tuple:
        return _convert_list(value, typing.get_args(tp)[0], path, problems)
    if origin is Mapping:
        return _convert_map(value, typing.get_args(tp)[1], path, problems)
    return _convert_scalar(value, tp, path, problems)


def _convert_scalar(value: object, tp: Any, path: str, problems: Collector) -> Any:
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:  # str, Path, Secret: all written as strings
        ok = isinstance(value, str)
    if ok:
        return float(value) if tp is float else tp(value)  # type: ignore[arg-type]
    expected = {bool: "a boolean", int: "an integer", float: "a number"}.get(tp, "a string")
    # Never echo what was given for a secret.
    shown = "" if tp is Secret else f" {value!r}"
    problems.add(path, f"expected {expected}, got {type(value).__name__}{shown}")
    return _INVALID


def _convert_list(value: object, item_tp: Any, path: str, problems: Collector) -> Any:
    if not isinstance(value, list | tuple):
        problems.add(path, f"expected a list, got {type(value).__name__} {value!r}")
        return _INVALID
    items = [_convert(item, item_tp, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    return _INVALID if any(item is _INVALID for item in items) else tuple(items)


def _convert_map(value: object, value_tp: Any, path: str, problems: Collector) -> Any:
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping, got {type(value).__name__} {value!r}")
        return _INVALID
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.add(path, f"keys must be strings, got {key!r}")
            continue
        out[key] = _convert(item, value_tp, _join(path, key), problems)
    if len(out) != len(value) or any(v is _INVALID for v in out.values()):
        return _INVALID
    return types.MappingProxyType(out)


def _convert_section(value: object, cls: type, path: str, problems: Collector) -> Any:
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping, got {type(value).__name__}")
        return _INVALID
    before = len(problems.items)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in value:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.add(_join(path, str(key)), f"unknown key{hint}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key_path = _join(path, name)
        raw = value.get(name)
        if raw is None:
            if f.default is not dataclasses.MISSING:
                kwargs[name] = f.default  # absent or null: the default
            elif f.default_factory is not dataclasses.MISSING:
                kwargs[name] = f.default_factory()
            else:
                problems.add(
                    key_path, "missing required key" if name not in value else "must not be null"
                )
            continue
        converted = _convert(raw, hints[name], key_path, problems)
        if converted is not _INVALID:
            kwargs[name] = converted
    for key, problem in problems_in(cls, kwargs):
        problems.add(_join(path, key), problem)
    return _INVALID if len(problems.items) > before else cls(**kwargs)


def config_from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """A Config from parsed YAML-like data, with the `RSUB_*` overrides of `env` applied."""
    return _build(data, env or {}, source=None)
