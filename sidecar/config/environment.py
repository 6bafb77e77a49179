"""`RSUB_*` environment overrides of the configuration file's keys.

`RSUB_<KEY>` with `__` between nesting levels (`RSUB_NATS__SERVERS`,
`RSUB_SNAPSHOT__INTERVAL_MS`). Scalars are parsed to the declared type, lists of scalars
are comma separated, lists of sections and maps are YAML flow text
(`RSUB_STREAMS='[{name: orders}]'`), and an empty value sets an optional key to null.
An `RSUB_` variable that names no key is an error when it looks like a mistyped setting, and
is otherwise ignored (Kubernetes service links, for one); docs/configuration.md has the rule.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import yaml

from sidecar.config.checks import Collector, optional_inner
from sidecar.config.schema import Config

ENV_PREFIX = "RSUB_"

# What Kubernetes injects for every Service in the namespace ("service links"), the Service
# name upper-cased with '-' as '_': <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT,
# <SVC>_SERVICE_PORT_<PORT NAME>, <SVC>_PORT and <SVC>_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR].
# A Service named `rsub` or `rsub-...` gives such RSUB_ variables. A Service name ends with a
# letter or digit, so a variable with `__` before its last word never has this shape.
_SERVICE_LINK_RE = re.compile(
    r"[A-Z](?:[A-Z0-9_]*[A-Z0-9])?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9]+(?:_[A-Z0-9]+)*)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)
# Similarity (difflib ratio, nesting ignored) from which an unknown variable counts as a typo
# of a setting: RSUB_REGOIN, RSUB_LOG_LVL and RSUB_NATS__SERVER are; RSUB_VERSION is not.
_TYPO_CUTOFF = 0.8

_EnvUse = Literal["setting", "service link", "unrelated"]


def _setting_paths(section: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The key path of every key an environment variable can set (sections are walked into)."""
    hints = typing.get_type_hints(section)
    for f in dataclasses.fields(section):
        tp = optional_inner(hints[f.name]) or hints[f.name]
        if dataclasses.is_dataclass(tp):
            assert isinstance(tp, type)
            yield from _setting_paths(tp, (*prefix, f.name))
        else:
            yield (*prefix, f.name)


def _flat(name: str) -> str:
    """The words after the prefix, joined by one `_`: RSUB_LEASE__BUCKET -> lease_bucket."""
    return "_".join(word for word in name[len(ENV_PREFIX) :].lower().split("_") if word)


# Every setting's variable, by its flattened name.
_SETTING_VARS = {
    "_".join(path): ENV_PREFIX + "__".join(path).upper() for path in _setting_paths(Config)
}
_TOP_LEVEL_KEYS = frozenset(f.name for f in dataclasses.fields(Config))


def _did_you_mean(var: str) -> str | None:
    """The setting variable `var` most likely stands for: the same words nested otherwise
    (RSUB_LEASE_BUCKET), or a close spelling (RSUB_REGOIN); None if nothing is close."""
    close = difflib.get_close_matches(_flat(var), _SETTING_VARS, n=1, cutoff=_TYPO_CUTOFF)
    return _SETTING_VARS[close[0]] if close else None


def _env_use(var: str) -> _EnvUse:
    """How the loader treats an `RSUB_` variable (docs/configuration.md has the rule).

    "setting": meant to set a key (it names one, starts with a top-level key, or is a likely
    typo of a setting), so anything wrong with it is a configuration error; "service link":
    a Kubernetes service-link variable, ignored silently; "unrelated": ignored, and `rsub run`
    logs its name (never its value) at start.
    """
    if var in _SETTING_VARS.values():  # a setting wins even if a Service could make it
        return "setting"
    if _SERVICE_LINK_RE.fullmatch(var):
        return "service link"
    first = var[len(ENV_PREFIX) :].split("__")[0].lower()
    if first in _TOP_LEVEL_KEYS or _did_you_mean(var) is not None:
        return "setting"
    return "unrelated"


def unrelated_env(env: Mapping[str, str]) -> list[str]:
    """The names of the `RSUB_` variables in `env` that the loader ignores as unrelated."""
    return [
        var for var in sorted(env) if var.startswith(ENV_PREFIX) and _env_use(var) == "unrelated"
    ]


def apply_env(
    data: dict[str, Any], env: Mapping[str, str], problems: Collector
) -> tuple[dict[str, Any], dict[str, str]]:
    """Return `data` with the `RSUB_*` overrides applied, and {key path: variable}."""
    env_paths: dict[str, str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or _env_use(var) != "setting":
            continue
        keys = [part.lower() for part in var[len(ENV_PREFIX) :].split("__")]
        tp = _env_target(var, keys, problems)
        if tp is None:
            continue
        try:
            parsed = _parse_env_value(env[var], tp)
        except ValueError as exc:
            problems.add(".".join(keys), f"{exc} (from {var})")
            continue
        target = data
        for key in keys[:-1]:
            section = target.get(key)
            section = dict(section) if isinstance(section, Mapping) else {}
            target[key] = section
            target = section
        target[keys[-1]] = parsed
        env_paths[".".join(keys)] = var
    return data, env_paths


def _env_target(var: str, keys: list[str], problems: Collector) -> Any | None:
    """The declared type at `keys`, or None after recording why the variable is unusable."""
    tp: Any = Config
    for depth, key in enumerate(keys):
        section: Any = optional_inner(tp) or tp
        if not dataclasses.is_dataclass(section):
            problems.add(var, f"unknown setting: {'.'.join(keys[:depth])} has no sub-keys")
            return None
        if key not in {f.name for f in dataclasses.fields(section)}:
            close = _did_you_mean(var)
            hint = f" (did you mean {close}?)" if close else ""
            problems.add(var, f"unknown setting: no key {'.'.join(keys[: depth + 1])!r}{hint}")
            return None
        tp = typing.get_type_hints(section)[key]
    if dataclasses.is_dataclass(optional_inner(tp) or tp):
        problems.add(var, f"{'.'.join(keys)} is a section; set its keys as {var}__<KEY>")
        return None
    return tp


def _parse_env_value(text: str, tp: Any) -> object:
    """Parse an environment string into the plain value the YAML would have held."""
    inner = optional_inner(tp)
    if inner is not None:
        return None if text == "" else _parse_env_value(text, inner)
    origin = typing.get_origin(tp)
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item_tp):
            return parse_yaml(text)
        items = [item.strip() for item in text.split(",")]
        if "" in items:
            raise ValueError(f"empty item in comma-separated list {text!r}")
        return [_parse_env_value(item, item_tp) for item in items]
    if origin is Mapping:
        return parse_yaml(text)
    if tp is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected a boolean (true/false), got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {text!r}") from None
    return text


def parse_yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {yaml_problem(exc)}") from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A one-line description of a YAML error (the default text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())
