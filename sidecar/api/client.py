"""The one way a client opens a gRPC channel to a sidecar: `rsub` commands and Spark alike.

The channel is insecure, or TLS trusting a private CA, optionally with a client certificate
(mutual TLS); the bearer token travels as call metadata, which is what the server checks.
Files are read here, at once, so a wrong path fails before any call with a message naming
the caller's option (`--tls-ca` for the command line, `sidecarTlsCa` for Spark).
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import NamedTuple

import grpc


class TlsOptionNames(NamedTuple):
    """How the caller calls its CA, certificate and key options, for error messages."""

    ca: str
    cert: str
    key: str


# A connection of its own per channel: gRPC otherwise shares one with earlier channels to the
# same address, so a new client behind a Service would keep reaching the same replica.
_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def open_channel(
    address: str,
    names: TlsOptionNames,
    *,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> grpc.Channel:
    """A channel to `address`: TLS when `ca` is given; ValueError naming the bad option."""
    if (cert is None) != (key is None):
        raise ValueError(f"{names.cert} and {names.key} go together")
    if ca is None:
        if cert is not None:
            raise ValueError(f"{names.cert} needs {names.ca}")
        return grpc.insecure_channel(address, options=_OPTIONS)
    root = _read(ca, names.ca)
    _check_pem(root, ca, names.ca)
    chain = private = None
    if cert is not None and key is not None:
        chain, private = _read(cert, names.cert), _read(key, names.key)
        _check_pair(cert, key, names)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root, private_key=private, certificate_chain=chain
    )
    return grpc.secure_channel(address, credentials, options=_OPTIONS)


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of every call: the bearer token when there is one."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _check_pem(data: bytes, path: Path, option: str) -> None:
    """Refuse a CA file that holds no certificate here, naming the option: gRPC would only
    log a C++ error and report the sidecar as unreachable."""
    try:
        ssl.create_default_context().load_verify_locations(cadata=data.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{option}: {path} holds no PEM certificate ({_reason(error)})") from None


def _check_pair(cert: Path, key: Path, names: TlsOptionNames) -> None:
    try:
        ssl.create_default_context().load_cert_chain(cert, key)
    except ssl.SSLError as error:
        raise ValueError(
            f"{names.cert}/{names.key}: {cert} and {key} are not a PEM certificate and its "
            f"key ({_reason(error)})"
        ) from None


def _reason(error: Exception) -> str:
    """OpenSSL's words without the source location (`... (_ssl.c:4020)`)."""
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(error)) or error.__class__.__name__


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"{option}: cannot read {path}: {error.strerror}") from error
