"""The nats-server permission blocks of docs/security.md, read from the page itself.

The page is the single source: the tests run nats-server with exactly what it documents.
A block sits between `<!-- <name>:begin -->` and `<!-- <name>:end -->` in a ```conf fence.
Parsing is deliberately narrow: `user: "..."`, `publish: { allow: [...] deny: [...] }`,
`subscribe: { allow: [...] }`, one quoted subject per entry, `#` comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
SIDECAR_BLOCK = "rsub-sidecar-permissions"
# The sidecar's block with stream discovery on (any stream of the account).
SIDECAR_DISCOVERY_BLOCK = "rsub-sidecar-discovery-permissions"
APP_BLOCK = "rsub-app-permissions"
# The region the documented blocks are written for, and the other region they name.
DOC_REGION, DOC_OTHER = "west", "east"

_QUOTED = re.compile(r'"([^"]*)"')


@dataclass(frozen=True)
class UserBlock:
    text: str  # the conf text as documented
    user: str
    publish_allow: tuple[str, ...]
    publish_deny: tuple[str, ...]
    subscribe_allow: tuple[str, ...]

    def for_region(self, region: str) -> UserBlock:
        """The block for `region` of a two-region deployment: swap the two region names."""
        if region == DOC_REGION:
            return self

        def swap(value: str) -> str:
            placeholder = "\0"
            return (
                value.replace(DOC_REGION, placeholder)
                .replace(DOC_OTHER, DOC_REGION)
                .replace(placeholder, region)
            )

        return UserBlock(
            text=swap(self.text),
            user=swap(self.user),
            publish_allow=tuple(swap(s) for s in self.publish_allow),
            publish_deny=tuple(swap(s) for s in self.publish_deny),
            subscribe_allow=tuple(swap(s) for s in self.subscribe_allow),
        )

    def without(self, subject: str) -> UserBlock:
        """The same user lacking one publish permission."""
        if subject not in self.publish_allow:
            raise ValueError(f"{subject!r} is not in the documented block")
        allow = tuple(s for s in self.publish_allow if s != subject)
        return UserBlock(self.text, self.user, allow, self.publish_deny, self.subscribe_allow)

    def server_user(self, password: str) -> dict[str, Any]:
        """The user as nats-server JSON configuration."""
        publish: dict[str, Any] = {"allow": list(self.publish_allow)}
        if self.publish_deny:
            publish["deny"] = list(self.publish_deny)
        return {
            "user": self.user,
            "password": password,
            "permissions": {
                "publish": publish,
                "subscribe": {"allow": list(self.subscribe_allow)},
            },
        }


def block_text(name: str, doc: Path = DOC) -> str:
    page = doc.read_text()
    match = re.search(
        rf"<!-- {name}:begin -->\s*```conf\n(.*?)```\s*<!-- {name}:end -->", page, re.DOTALL
    )
    if match is None:
        raise ValueError(f"{doc}: no ```conf block between the {name} markers")
    return match.group(1)


def _strings(section: str) -> tuple[str, ...]:
    return tuple(_QUOTED.findall(section))


def _list_after(text: str, key: str) -> str:
    """The text of the `[...]` list that follows `key:` (empty when the key is absent)."""
    match = re.search(rf"\b{key}\s*:\s*\[(.*?)\]", text, re.DOTALL)
    return match.group(1) if match else ""


def parse_user(name: str, doc: Path = DOC) -> UserBlock:
    text = block_text(name, doc)
    bare = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    user = re.search(r'\buser\s*:\s*"([^"]+)"', bare)
    publish = re.search(r"\bpublish\s*:\s*\{(.*?)\}", bare, re.DOTALL)
    subscribe = re.search(r"\bsubscribe\s*:\s*\{(.*?)\}", bare, re.DOTALL)
    if user is None or publish is None or subscribe is None:
        raise ValueError(f"block {name}: expected user, publish and subscribe")
    return UserBlock(
        text=text,
        user=user.group(1),
        publish_allow=_strings(_list_after(publish.group(1), "allow")),
        publish_deny=_strings(_list_after(publish.group(1), "deny")),
        subscribe_allow=_strings(_list_after(subscribe.group(1), "allow")),
    )
