"""The subject transforms of stream sources (matching and overlap are the product's:
`sidecar.nats.topology.subject_within` and `subjects_overlap`).

A transform maps subjects matching its source pattern to its destination, where `$n` or
`{{wildcard(n)}}` is the source's n-th `*` token, a bare `*` the source's next `*` in order,
and a last `>` the tokens the source's `>` matched (`foo.*.>` -> `foo.>` renames
`foo.east.a.b` to `foo.a.b`: docs/topology.md). The server's other mapping functions
(partition, split, ...) are not modelled: a transform using one is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.nats.topology import subject_within

_WILDCARD_REF = re.compile(r"^(?:\$(\d+)|\{\{\s*wildcard\s*\(\s*(\d+)\s*\)\s*\}\})$")


@dataclass(frozen=True, slots=True)
class SubjectTransform:
    """One `{"src", "dest"}` of a source's `subject_transforms` (an empty side means `>`)."""

    src: str
    dest: str

    def __post_init__(self) -> None:
        src, dest = self.src or ">", self.dest or ">"
        stars = src.split(".").count("*")
        for i, token in enumerate(dest.split(".")):
            ref = _WILDCARD_REF.match(token)
            if ref and not 1 <= int(ref.group(1) or ref.group(2)) <= stars:
                raise ValueError(f"transform {src} -> {dest}: no wildcard {token} in the source")
            if token == ">" and (not src.endswith(">") or i != dest.count(".")):
                raise ValueError(f"transform {src} -> {dest}: '>' must end both sides")
            if "{{" in token and not ref:
                raise ValueError(f"transform {src} -> {dest}: {token} is not modelled")
        if dest.split(".").count("*") > stars:
            raise ValueError(f"transform {src} -> {dest}: more '*' than the source has")

    def apply(self, subject: str) -> str | None:
        """`subject` transformed, or None when it does not match the source."""
        src, dest = self.src or ">", self.dest or ">"
        if not subject_within(subject, src):
            return None
        tokens, stars, tail = subject.split("."), [], ""
        for i, token in enumerate(src.split(".")):
            if token == "*":
                stars.append(tokens[i])
            elif token == ">":
                tail = ".".join(tokens[i:])
        out: list[str] = []
        next_star = iter(stars)
        for token in dest.split("."):
            ref = _WILDCARD_REF.match(token)
            if ref:
                out.append(stars[int(ref.group(1) or ref.group(2)) - 1])
            elif token == "*":
                out.append(next(next_star))
            elif token == ">":
                out.append(tail)
            else:
                out.append(token)
        return ".".join(out)


@dataclass(slots=True)
class _Node:
    names: dict[str, None]
    children: dict[str, _Node]


class SubjectIndex:
    """Names (of streams) by the subject patterns they hold, to find the few whose patterns
    may overlap a subject without looking at every other: each name is kept at the node of
    its pattern's literal tokens before the first wildcard."""

    def __init__(self) -> None:
        self._root = _Node({}, {})

    @staticmethod
    def _literal(subject: str) -> list[str]:
        tokens = subject.split(".")
        for i, token in enumerate(tokens):
            if token in ("*", ">"):
                return tokens[:i]
        return tokens

    def add(self, name: str, subject: str) -> None:
        node = self._root
        for token in self._literal(subject):
            node = node.children.setdefault(token, _Node({}, {}))
        node.names[name] = None

    def remove(self, name: str, subject: str) -> None:
        node: _Node | None = self._root
        for token in self._literal(subject):
            node = node.children.get(token) if node is not None else None
        if node is not None:
            node.names.pop(name, None)

    def candidates(self, subject: str) -> set[str]:
        """Every name holding a pattern that may overlap `subject` (and maybe a few more):
        those whose literal tokens are a prefix of its own, or extend them."""
        node = self._root
        found = set(node.names)
        for token in self._literal(subject):
            child = node.children.get(token)
            if child is None:
                return found
            node = child
            found.update(node.names)
        below = list(node.children.values())
        while below:
            deeper = below.pop()
            found.update(deeper.names)
            below.extend(deeper.children.values())
        return found
