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
