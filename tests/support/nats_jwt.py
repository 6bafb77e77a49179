"""NATS decentralized auth for tests: nkeys, operator/account/user JWTs and a creds file.

A NATS JWT is `base64url(header).base64url(claims).base64url(signature)` without padding,
header `{"typ":"JWT","alg":"ed25519-nkey"}`, signed with the issuer's ed25519 nkey over
`header.claims`. The `jti` is a base32 hash of the claims (unique id; the server does not
recompute it). Operators sign accounts, accounts sign users.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    # JetStream is enabled for an account by giving it storage.
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}


@dataclass(frozen=True)
class NKey:
    seed: bytes
    public: str

    @classmethod
    def generate(cls, prefix: int) -> NKey:
        seed = nkeys.encode_seed(os.urandom(32), prefix)
        pair = nkeys.from_seed(bytearray(seed))
        return cls(seed=seed, public=pair.public_key.decode())

    def sign(self, data: bytes) -> bytes:
        signature: bytes = nkeys.from_seed(bytearray(self.seed)).sign(data)
        return signature


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(issuer: NKey, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public,
        "name": name,
        "sub": subject,
    }
    digest = hashlib.new("sha512_256", json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    claims["nats"] = {**nats, "version": 2}
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


@dataclass(frozen=True)
class OperatorSetup:
    """An operator, a system account and an application account with JetStream."""

    operator_jwt: str
    system_account: str
    accounts: dict[str, str]  # account public key -> account JWT
    account_key: NKey

    def server_config(self) -> dict[str, Any]:
        """Top-level nats-server settings for operator mode with the memory resolver."""
        return {
            "operator": self.operator_jwt,
            "system_account": self.system_account,
            "resolver": "MEMORY",
            "resolver_preload": self.accounts,
        }

    def user_creds(self, name: str, permissions: dict[str, Any] | None = None) -> str:
        """A creds file's text for a new user of the application account."""
        user = NKey.generate(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {"subs": -1, "data": -1, "payload": -1, "type": "user"}
        claims.update(permissions or {})
        jwt = encode_jwt(self.account_key, user.public, name, claims)
        return creds_text(jwt, user.seed)


def operator_setup() -> OperatorSetup:
    operator = NKey.generate(nkeys.PREFIX_BYTE_OPERATOR)
    system = NKey.generate(nkeys.PREFIX_BYTE_ACCOUNT)
    app = NKey.generate(nkeys.PREFIX_BYTE_ACCOUNT)
    operator_jwt = encode_jwt(
        operator,
        operator.public,
        "rsub-test-operator",
        {"type": "operator", "system_account": system.public},
    )
    system_jwt = encode_jwt(operator, system.public, "SYS", {"type": "account"})
    app_jwt = encode_jwt(
        operator, app.public, "APP", {"type": "account", "limits": _UNLIMITED_ACCOUNT}
    )
    return OperatorSetup(
        operator_jwt=operator_jwt,
        system_account=system.public,
        accounts={system.public: system_jwt, app.public: app_jwt},
        account_key=app,
    )


def creds_text(jwt: str, seed: bytes) -> str:
    """The creds file layout `nsc` writes (nats-py reads the two armored blocks)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )


def write_creds(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path
