"""Write the `config` part of the chart's values schema, and the reference table of the
settings in docs/configuration.md ("## Keys"), from the sidecar's settings model.

    python scripts/config_schema.py           # rewrite both (`make config-schema`)
    python scripts/config_schema.py --check   # exit 1 when either is not what would be written

The table has a row per key, sections walked in the model's order: its type (from the field's
type and what its check allows, or the `kind` of its metadata when the type says less), its
default, and its meaning (the `meaning` of its metadata, `setting(...)` in the model). It sits
between two comments in the page; the prose around it is the page's own.

The chart's `config` value is the sidecar's configuration file (`sidecar.config.schema.Config`)
less what the chart sets from values of its own: `region`, `grpc` and `http` (the ports), and
NATS credentials and TLS (`natsSecret`). Each key's JSON Schema comes from its type and from
what its check allows (`setting(meaning, check, json)` in the model), so the schema and the sidecar
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

from sidecar.config.checks import NOT_NEGATIVE, POSITIVE, optional_inner
from sidecar.config.schema import Config
from sidecar.config.secrets import Secret

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "helm" / "rsub-sidecar" / "values.schema.json"
DOC = ROOT / "docs" / "configuration.md"
TABLE_START = (
    "<!-- Written from the settings model (sidecar/config) by `make config-schema`: "
    "change the meanings there. -->\n\n"
)
TABLE_END = "\n<!-- End of the written table. -->\n"
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


_WORDS = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    Path: "path",
    Secret: "secret",
}


def type_words(tp: Any, allows: Mapping[str, Any], path: tuple[str, ...]) -> str:
    """The type column of a key of type `tp` whose check `allows` these JSON Schema keywords."""
    tp = optional_inner(tp) or tp
    origin = typing.get_origin(tp)
    if origin is Literal:
        return ", ".join(f"`{choice}`" for choice in typing.get_args(tp))
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return "list" if dataclasses.is_dataclass(item) else f"list of {_WORDS[item]}s"
    if tp not in _WORDS:
        raise TypeError(f"{'.'.join(path)}: no words for {tp!r}: give it a `kind`")
    words = _WORDS[tp]
    if allows.get("exclusiveMinimum") == POSITIVE["exclusiveMinimum"]:
        return f"{words} > 0"
    if "maximum" in allows:
        return f"{words} {allows['minimum']}..{allows['maximum']}"
    if allows.get("minimum") == NOT_NEGATIVE["minimum"]:
        return f"{words} ≥ 0"
    return words


def default_words(f: dataclasses.Field[Any]) -> str:
    """The default column: the field's default as the configuration file writes it."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "**required**"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return f"`{value}`"
    plain = list(value) if isinstance(value, tuple) else dict(value)
    return f"`{json.dumps(plain)}`"


def table_rows(section: type, prefix: str = "") -> list[str]:
    """The table's rows of `section`'s keys, under `prefix` (`nats.`, `streams[].`)."""
    hints = typing.get_type_hints(section)
    rows: list[str] = []
    for f in dataclasses.fields(section):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            assert isinstance(tp, type)
            rows += table_rows(tp, f"{key}.")
            continue
        meaning = f.metadata.get("meaning")
        if meaning is None:
            raise ValueError(f"{key}: no meaning: give its field `metadata=setting(...)`")
        path = tuple(key.split("."))
        kind = f.metadata["kind"] or type_words(tp, f.metadata["json"], path)
        cells = [f"`{key}`", kind, default_words(f), meaning]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
        if dataclasses.is_dataclass(item):
            assert isinstance(item, type)
            rows += table_rows(item, f"{key}[].")
    return rows


def reference_table() -> str:
    """docs/configuration.md's table of every key of the configuration file."""
    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return "\n".join(head + table_rows(Config)) + "\n"


def written_doc(current: str) -> str:
    """The page `current` with its reference table written from the model."""
    start = current.find(TABLE_START)
    end = current.find(TABLE_END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{DOC.relative_to(ROOT)}: the table's two comments are missing")
    return current[: start + len(TABLE_START)] + reference_table() + current[end:]


def main(argv: list[str]) -> int:
    drifted = 0
    for path, write in ((SCHEMA, written), (DOC, written_doc)):
        current = path.read_text()
        wanted = write(current)
        if "--check" not in argv:
            path.write_text(wanted)
        elif wanted != current:
            print(
                f"{path.relative_to(ROOT)} is not what the settings model gives: "
                "run `make config-schema`",
                file=sys.stderr,
            )
            drifted = 1
    return drifted


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
