"""Write the `config` part of the chart's values schema from the sidecar's settings model.

    python scripts/config_schema.py           # rewrite helm/rsub-sidecar/values.schema.json
    python scripts/config_schema.py --check   # exit 1 when the file is not what would be written

The chart's `config` value is the sidecar's configuration file (`sidecar.config.schema.Config`)
less what the chart sets from values of its own: `region`, `grpc` and `http` (the ports), and
NATS credentials and TLS (`natsSecret`). Each key's JSON Schema comes from its type and from
what its check allows (`checked_by(check, json)` in the model), so the schema and the sidecar
refuse the same settings; a key with a default also takes null (the loader reads null as the
default). Written by hand because the model's checks are rsub's own; the file keeps one
format (an object or list on one line when it fits in 100 columns).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from sidecar.config.checks import optional_inner
from sidecar.config.schema import Config
from sidecar.config.secrets import Secret

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "helm" / "rsub-sidecar" / "values.schema.json"
WIDTH = 100

# Keys of the configuration the chart sets from values of its own.
SET_BY_THE_CHART = {
    ("region",),
    ("grpc",),
    ("http",),
    ("nats", "user"),
    ("nats", "password"),
    ("nats", "token"),
    ("nats", "creds_file"),
    ("nats", "tls"),
}
# What the chart says or requires beyond the model: the streams go in every release (the same
# list, empty only with discovery on: `Config._check`).
CHART_RULES: dict[tuple[str, ...], dict[str, Any]] = {
    (): {
        "required": ["regions", "nats", "streams"],
        "if": {
            "not": {
                "required": ["discovery"],
                "properties": {
                    "discovery": {
                        "required": ["enabled"],
                        "properties": {"enabled": {"const": True}},
                    }
                },
            }
        },
        "then": {"properties": {"streams": {"minItems": 1}}},
    },
    ("nats",): {"description": "Credentials and TLS come from natsSecret, never from here."},
    ("streams",): {"type": "array", "description": "At least one stream unless discovery.enabled."},
}
_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "string"}


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "type" in schema:
        return {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    return schema


def type_schema(tp: Any, path: tuple[str, ...]) -> dict[str, Any]:
    """The JSON Schema of a value of type `tp` at `path`."""
    inner = optional_inner(tp)
    if inner is not None:
        return _nullable(type_schema(inner, path))
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        return section_schema(tp, path)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is tuple:
        return {"type": "array", "items": type_schema(typing.get_args(tp)[0], path)}
    if origin is Mapping:
        value = type_schema(typing.get_args(tp)[1], path)
        return {"type": "object", "additionalProperties": value}
    if tp is Secret or tp not in _SCALARS:
        raise TypeError(f"{'.'.join(path)}: no JSON Schema for {tp!r}")
    return {"type": _SCALARS[tp]}


def section_schema(section: type, path: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = typing.get_type_hints(section)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(section):
        key = (*path, f.name)
        if key in SET_BY_THE_CHART:
            continue
        schema = _merge(type_schema(hints[f.name], key), f.metadata.get("json", {}))
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        is_section = dataclasses.is_dataclass(optional_inner(hints[f.name]) or hints[f.name])
        if not has_default:
            required.append(f.name)
        elif not is_section and optional_inner(hints[f.name]) is None:
            schema = _nullable(schema)
        properties[f.name] = _merge(schema, CHART_RULES.get(key, {}))
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = required
    out["properties"] = properties
    return out


def formatted(value: Any, indent: int = 0, lead: int = 0) -> str:
    """`value` as JSON, two-space indented, each object or list on one line if it fits."""
    one = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    if not isinstance(value, dict | list) or indent + lead + len(one) <= WIDTH:
        return one
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        rows = []
        for key, item in value.items():
            name = json.dumps(key)
            rows.append(f"{pad}{name}: {formatted(item, indent + 2, len(name) + 2)}")
        return "{\n" + ",\n".join(rows) + "\n" + " " * indent + "}"
    rows = [pad + formatted(item, indent + 2) for item in value]
    return "[\n" + ",\n".join(rows) + "\n" + " " * indent + "]"


def written(current: str) -> str:
    """The values schema `current` with its `config` part made from the model."""
    schema = json.loads(current)
    schema["properties"]["config"] = _merge(section_schema(Config), CHART_RULES[()])
    return formatted(schema) + "\n"


def main(argv: list[str]) -> int:
    current = SCHEMA.read_text()
    wanted = written(current)
    if "--check" in argv:
        if wanted != current:
            print(
                f"{SCHEMA.relative_to(ROOT)} is not what the settings model gives: "
                "run `make config-schema`",
                file=sys.stderr,
            )
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
