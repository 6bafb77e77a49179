"""Generate the chart's README.md from README.md.tmpl, Chart.yaml and the comments of values.yaml.

    python scripts/chart_readme.py           # write helm/rsub-sidecar/README.md
    python scripts/chart_readme.py --check   # exit 1 when README.md is not what would be written

A value is described by the `# --` comment right above it (continued by the `#` lines that
follow). A map without a description is documented key by key; a described map is one row
(its keys may have rows of their own). A required key has no default: it is a commented-out
`# key: example` line ending a description that starts with `**Required.**`. A value with
neither a description nor a described parent is an error, so the README lists every value.
helm-docs reads the same comments, but it is a Go binary that cannot be installed offline.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "rsub-sidecar"
REQUIRED = "**Required.**"
_KEY_RE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_-]*):(?P<rest>\s.*|)$")
_COMMENTED_KEY_RE = re.compile(r"^(?P<indent> *)# (?P<key>[A-Za-z_][A-Za-z0-9_-]*):(?P<rest>\s.*)$")


class ValuesDocError(Exception):
    """values.yaml breaks the description conventions."""


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    description: str


@dataclass
class _Described:
    text: list[str]
    line: int


def value_rows(values_text: str) -> list[Row]:
    """One row per documented value of values.yaml, in file order."""
    data = yaml.safe_load(values_text) or {}
    lines = values_text.splitlines()
    rows: list[Row] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, described) of enclosing maps
    pending: _Described | None = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            if pending is not None:
                raise ValuesDocError(f"line {pending.line}: a description not followed by a key")
            continue
        if stripped.startswith("#"):
            body = stripped[1:]
            if body.startswith(" --"):
                if pending is not None:
                    raise ValuesDocError(f"line {number}: two descriptions in a row")
                pending = _Described([body[3:].strip()], number)
                continue
            if pending is None:
                continue  # a plain comment: for readers of values.yaml only
            commented = _COMMENTED_KEY_RE.match(line)
            following = lines[number].strip() if number < len(lines) else ""
            ends = following.startswith("# --") or not following.startswith("#")
            if pending.text[0].startswith(REQUIRED) and commented and ends:
                indent = len(commented["indent"])
                path = [k for i, k, _ in stack if i < indent] + [commented["key"]]
                example = yaml.safe_load(commented["rest"])
                rows.append(_row(path, example, pending, required=True))
                pending = None
            else:
                pending.text.append(body.strip())
            continue
        match = _KEY_RE.match(line)
        if match is None:
            continue  # a list item or a block value's continuation
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k, _ in stack] + [match["key"]]
        found, value = lookup(data, path)
        if not found:
            continue  # a key inside a list item
        if pending is not None:
            if pending.text[0].startswith(REQUIRED):  # a required key with a default
                raise ValuesDocError(f"line {number}: a required key is a `# key: example` line")
            rows.append(_row(path, value, pending, required=False))
        inside_described = any(described for _, _, described in stack)
        if pending is None and not inside_described and not (isinstance(value, dict) and value):
            raise ValuesDocError(f"line {number}: {'.'.join(path)} has no `# --` description")
        if isinstance(value, dict):
            stack.append((indent, match["key"], pending is not None or inside_described))
        pending = None
    if pending is not None:
        raise ValuesDocError(f"line {pending.line}: a description not followed by a key")
    return rows


def lookup(data: Any, path: Sequence[str]) -> tuple[bool, Any]:
    """(True, value) at the key path in nested maps, or (False, None) when it is absent."""
    node = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _row(path: list[str], value: Any, described: _Described, *, required: bool) -> Row:
    shown = _cell(json.dumps(value, ensure_ascii=False))
    return Row(
        key=".".join(path),
        type=_type_name(value),
        default=f"required, e.g. `{shown}`" if required else f"`{shown}`",
        description=_cell(" ".join(described.text)),
    )


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    for kind, name in ((int, "int"), (float, "float"), (str, "string"), (list, "list")):
        if isinstance(value, kind):
            return name
    return "object" if isinstance(value, dict) else "null"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def values_table(rows: Sequence[Row]) -> str:
    out = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    out += [f"| `{r.key}` | {r.type} | {r.default} | {r.description} |" for r in rows]
    return "\n".join(out)


def render_readme(chart: Path = CHART) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text(encoding="utf-8"))
    rows = value_rows((chart / "values.yaml").read_text(encoding="utf-8"))
    template = Template((chart / "README.md.tmpl").read_text(encoding="utf-8"))
    return template.substitute(
        name=meta["name"],
        description=meta["description"],
        version=meta["version"],
        app_version=meta["appVersion"],
        kube_version=meta["kubeVersion"],
        values=values_table(rows),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    target = CHART / "README.md"
    try:
        text = render_readme()
    except ValuesDocError as exc:
        print(f"{CHART / 'values.yaml'}: {exc}", file=sys.stderr)
        return 1
    if "--check" in args:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target.relative_to(ROOT)} is stale; run `python scripts/chart_readme.py`")
            return 1
        print(f"{target.relative_to(ROOT)} is current")
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
