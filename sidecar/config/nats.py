"""How to connect to NATS: the one settings model the sidecar, the command line and the
Spark source build (each names the keys its own way: `nats.token`, `--token`, `token`)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.config.checks import (
    ConfigError,
    Problem,
    Section,
    cert_and_key,
    existing_file,
    positive_setting,
    setting,
)
from sidecar.config.secrets import Secret, repr_hiding_userinfo

_NATS_URL_RE = re.compile(r"(nats|tls|ws|wss)://([^/?#@]+@)?[^/?#@:]+(:\d+)?/?")


def _nats_urls(value: tuple[str, ...]) -> str | None:
    if not value:
        return "must list at least one server"
    bad = [url for url in value if not _NATS_URL_RE.fullmatch(url)]
    if bad:
        return f"invalid server URL(s) {bad}: expected nats://host[:port] (or tls, ws, wss)"
    return None


@dataclass(frozen=True)
class NatsTlsConfig(Section):
    ca_file: Path | None = field(
        default=None,
        metadata=setting("CA bundle to verify the servers; must exist", existing_file),
    )
    cert_file: Path | None = field(
        default=None,
        metadata=setting(
            "client certificate (mutual TLS); set with `key_file`; must exist", existing_file
        ),
    )
    key_file: Path | None = field(
        default=None,
        metadata=setting("client key; set with `cert_file`; must exist", existing_file),
    )
    server_name: str | None = field(
        default=None, metadata=setting("name expected in the server certificate")
    )

    _check = staticmethod(cert_and_key)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.ca_file, self.cert_file, self.server_name))


@dataclass(frozen=True)
class NatsConfig(Section):
    servers: tuple[str, ...] = field(
        metadata=setting(
            "the local region's NATS servers, `nats://`, `tls://`, `ws://` or `wss://` "
            "`host[:port]`",
            _nats_urls,
            {"minItems": 1, "items": {"pattern": "^(nats|tls|ws|wss)://"}},
            kind="list of URLs",
        )
    )
    user: str | None = field(default=None, metadata=setting("user name; needs `nats.password`"))
    password: Secret | None = field(default=None, metadata=setting("password; needs `nats.user`"))
    token: Secret | None = field(default=None, metadata=setting("token authentication"))
    creds_file: Path | None = field(
        default=None,
        metadata=setting("a NATS `.creds` file (JWT + nkey); must exist", existing_file),
    )
    tls: NatsTlsConfig = field(default_factory=NatsTlsConfig)
    connect_timeout_s: float = field(
        default=5.0, metadata=positive_setting("connection timeout, seconds")
    )

    __repr__ = repr_hiding_userinfo

    @staticmethod
    def _check(v: Mapping[str, Any]) -> Iterator[Problem]:
        has = {key: v.get(key) is not None for key in ("user", "password", "token", "creds_file")}
        if has["user"] != has["password"]:
            yield (
                "user" if has["password"] else "password",
                "user and password must be set together",
            )
        methods = [
            method
            for method, used in (
                ("user/password", has["user"] or has["password"]),
                ("token", has["token"]),
                ("creds_file", has["creds_file"]),
            )
            if used
        ]
        if len(methods) > 1:
            yield (
                "token" if has["token"] else "creds_file",
                f"choose one authentication method, got {' and '.join(methods)}",
            )


def nats_settings(
    servers: tuple[str, ...],
    *,
    user: str | None = None,
    password: Secret | None = None,
    token: Secret | None = None,
    creds_file: Path | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    connect_timeout_s: float = 5.0,
) -> NatsConfig:
    """The settings from flat values (a command line's, Spark options'): every problem, TLS
    and the rest together, in one `ConfigError` keyed by the settings' paths (`tls.ca_file`)."""
    found: list[Problem] = []
    try:
        tls = NatsTlsConfig(ca_file=ca_file, cert_file=cert_file, key_file=key_file)
    except ConfigError as exc:
        found += [(f"tls.{key}", problem) for key, problem in exc.keyed]
        tls = NatsTlsConfig()
    try:
        config = NatsConfig(
            servers=servers,
            user=user,
            password=password,
            token=token,
            creds_file=creds_file,
            tls=tls,
            connect_timeout_s=connect_timeout_s,
        )
    except ConfigError as exc:
        found += exc.keyed
    if found:
        raise ConfigError.of(found)
    return config


def renamed(error: ConfigError, names: Mapping[str, str]) -> str:
    """`error`'s problems, one per line, each under the name a front end gives its key."""
    return "\n".join(f"{names.get(key, key)}: {problem}" for key, problem in error.keyed)
