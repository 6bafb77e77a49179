"""One NATS connection for the sidecar, built from `NatsConfig`, that never gives up.

`NatsConnection.connect()` keeps trying until the first connection succeeds or `close()` is
called, except that a refusal of the configured credentials or TLS settings at that first
connection raises `NatsRefused` (no retry will fix it). After that nats-py reconnects
forever, refusals included (credentials may be rotated back), and if nats-py ever closes the
client for good, a new one is connected (so `nc`/`js` may change: fetch them again after
`on_change`). The callbacks only log and flip `connected`, and call the optional
`on_change(connected)` hook.

    conn = NatsConnection(config.nats, name="rsub-west")
    await conn.connect()
    conn.js.publish(...); conn.connected
    await conn.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import ParseResult

import nats
import structlog
from nats.aio.client import Client
from nats.errors import AuthorizationError, NoServersError
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.manager import JetStreamManager

from sidecar.config.checks import ConfigError
from sidecar.config.nats import NatsConfig, NatsTlsConfig
from sidecar.config.secrets import hide_userinfo

log = structlog.get_logger(__name__)

_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 5.0
_RECONNECT_WAIT_S = 1
# A one-shot client tries each server twice, briefly apart: it reports, it does not wait out.
_ONE_SHOT_RETRY_WAIT_S = 0.2
_CLOSE_TIMEOUT_S = 5.0


def tls_context(tls: NatsTlsConfig) -> ssl.SSLContext | None:
    """An SSL context trusting `ca_file` (else the system CAs), with the client cert if any."""
    if not tls.enabled:
        return None
    context = ssl.create_default_context(
        cafile=str(tls.ca_file) if tls.ca_file is not None else None
    )
    if tls.cert_file is not None:
        key = str(tls.key_file) if tls.key_file is not None else None
        context.load_cert_chain(str(tls.cert_file), key)
    return context


def connect_options(config: NatsConfig, *, one_shot: bool = False) -> dict[str, Any]:
    """Keyword arguments for `nats.connect` (authentication, TLS, reconnect policy).

    The sidecar reconnects forever. A `one_shot` client (`rsub topology apply`, the Spark
    source) tries each
    server twice at most and never reconnects: an unreachable or refusing cluster ends it at
    once (nats-py, left to retry a failed TLS handshake itself, can hang).
    """
    options: dict[str, Any] = {
        "servers": list(config.servers),
        "connect_timeout": config.connect_timeout_s,
        "allow_reconnect": not one_shot,
        "max_reconnect_attempts": 1 if one_shot else -1,
        "reconnect_time_wait": _ONE_SHOT_RETRY_WAIT_S if one_shot else _RECONNECT_WAIT_S,
    }
    if config.user is not None and config.password is not None:
        options["user"] = config.user
        options["password"] = config.password.reveal()
    if config.token is not None:
        options["token"] = config.token.reveal()
    if config.creds_file is not None:
        options["user_credentials"] = str(config.creds_file)
    context = tls_context(config.tls)
    if context is not None:
        options["tls"] = context
        if config.tls.server_name is not None:
            options["tls_hostname"] = config.tls.server_name
    return options


def server_address(url: ParseResult | None) -> str | None:
    """`scheme://host:port` of a server URL, never its user info (it may hold a password)."""
    if url is None:
        return None
    host = url.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{host}{port}"


def shown_servers(servers: Iterable[str]) -> str:
    """Server URLs for messages, comma-separated, their user info (passwords) hidden."""
    return hide_userinfo(",".join(servers))


class NatsRefused(ConnectionError):
    """The server refused this client's credentials or certificate at the first connection."""


class NatsUnreachable(ConnectionError):
    """No server answered (as opposed to NatsRefused: one answered and refused us)."""


# Server errors that no retry will fix (matched lower-cased).
_REFUSALS = ("authorization violation", "authentication expired", "authentication revoked")
# TLS failures that say the connection dropped, not that the peer refused us.
_TLS_DROPS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def refusal(err: BaseException) -> str | None:
    """Why `err` is a refusal of this client's credentials or TLS settings, else None."""
    if isinstance(err, ssl.SSLError):
        if isinstance(err, _TLS_DROPS):
            return None
        detail = getattr(err, "verify_message", None)
        return f"TLS {err.reason or err}" + (f" ({detail})" if detail else "")
    # nats-py raises this one (str: "authorization failed") for the server's violation error.
    text = _REFUSALS[0] if isinstance(err, AuthorizationError) else str(err).lower()
    return next((f"server says {r!r}" for r in _REFUSALS if r in text), None)


def refused(config: NatsConfig, reason: str) -> NatsRefused:
    """The error for a refused first connection: which settings, and why (never a secret)."""
    return NatsRefused(f"NATS refused the connection ({auth_method(config)}): {reason}")


def auth_method(config: NatsConfig) -> str:
    """The configured authentication, for error messages (never a secret)."""
    if config.user is not None:
        method = f"user/password for user {config.user!r}"
    elif config.token is not None:
        method = "token"
    elif config.creds_file is not None:
        method = f"creds file {str(config.creds_file)!r}"
    else:
        method = "no credentials"
    tls = config.tls
    if tls.enabled:
        ca = f"CA file {str(tls.ca_file)!r}" if tls.ca_file is not None else "system CAs"
        cert = f", client cert {str(tls.cert_file)!r}" if tls.cert_file is not None else ""
        method += f", TLS with {ca}{cert}"
    return method


async def connect_once(config: NatsConfig, name: str) -> Client:
    """One connection, no retry (a command, a Spark task): `NatsRefused` if a server refused
    these settings, `NatsUnreachable` if none answered, `ConfigError` (key `tls`) if a TLS
    file cannot be used; none names a secret."""
    try:
        options = connect_options(config, one_shot=True)
    except OSError as exc:  # a TLS file unreadable, or not a certificate or key
        raise ConfigError.of([("tls", f"cannot use the TLS files: {exc}")]) from None
    errors: list[Exception] = []

    async def remember(error: Exception) -> None:
        errors.append(error)

    try:
        return await nats.connect(name=name, error_cb=remember, **options)
    except (OSError, TimeoutError, NatsError) as exc:
        reason = next((r for r in map(refusal, [*errors, exc]) if r is not None), None)
        if reason is not None:
            raise refused(config, reason) from None
        cause = errors[-1] if errors else exc
        raise NatsUnreachable(
            f"cannot reach NATS at {shown_servers(config.servers)}: {cause!r}"
        ) from None


@dataclass
class _Repeats:
    """One error's schedule in `QuietRepeats`."""

    next: float
    gap: float = 1.0
    held_back: int = 0


class QuietRepeats:
    """Whether to log an error that may repeat: the first time, then after 1, 2, 4, ... s of
    the same error (at most every `max_gap_s`), with how many were held back in between.
    Each error (`key`) keeps its own schedule, so errors that take turns (each server of a
    region failing, in its own way or the same way) are each logged.

    nats-py reports every failed reconnect attempt (one per second per server while NATS is
    unreachable); an outage of an hour should cost a few dozen lines, not thousands.
    """

    # Distinct errors remembered at most (the oldest forgotten first): a few per server.
    _MAX_KEYS = 64

    def __init__(
        self, *, max_gap_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_gap = max_gap_s
        self._clock = clock
        self._repeats: dict[str, _Repeats] = {}
        self._last: _Repeats | None = None

    @property
    def held_back(self) -> int:
        """How many of the error last asked about were not logged since it last was."""
        return self._last.held_back if self._last is not None else 0

    def due(self, key: str) -> bool:
        """True when this occurrence of `key` should be logged (`held_back` then tells how many
        were not since the last logged one)."""
        now = self._clock()
        repeats = self._last = self._repeats.get(key)
        if repeats is None:
            if len(self._repeats) >= self._MAX_KEYS:
                del self._repeats[next(iter(self._repeats))]
            self._repeats[key] = self._last = _Repeats(next=now + 1.0)
            return True
        if now < repeats.next:
            repeats.held_back += 1
            return False
        repeats.next = now + repeats.gap
        repeats.gap = min(repeats.gap * 2, self._max_gap)
        return True

    def logged(self) -> None:
        if self._last is not None:
            self._last.held_back = 0

    def reset(self) -> None:
        """The trouble is over: the next error is logged at once."""
        self._repeats.clear()
        self._last = None


def current_server(nc: Client) -> ParseResult | None:
    """The server `nc` is connected to, else the one it tried last: the server an error it
    reports is about. nats-py's errors name none (an authorization violation, a timeout), but
    it stamps each server of its pool as it starts connecting to it (`Srv.last_attempt`,
    nats-py 2.16), whether that is a first connection, a reconnection or its TLS upgrade."""
    if nc.connected_url is not None:
        return nc.connected_url
    tried = [(srv.last_attempt, srv.uri) for srv in nc._server_pool if srv.last_attempt]
    return max(tried, key=lambda attempt: attempt[0])[1] if tried else None


class NatsConnection:
    def __init__(
        self,
        config: NatsConfig,
        *,
        name: str,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._config = config
        self._name = name
        self._on_change = on_change
        self._nc: Client | None = None
        self._js: tuple[Client, JetStreamContext] | None = None
        self._closing = False
        self._attempt: asyncio.Task[None] | None = None
        self._reopen: asyncio.Task[None] | None = None
        self._refused: str | None = None
        self._errors = QuietRepeats()
        self.connected = False

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise RuntimeError("NatsConnection.connect() has not completed")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context of the current client, made once per client (nats-py makes
        a new one at every `jetstream()`, which showed in the profiles at a thousand streams: docs/benchmarks.md)."""
        nc = self.nc
        if self._js is None or self._js[0] is not nc:
            self._js = (nc, nc.jetstream())
        return self._js[1]

    @property
    def jsm(self) -> JetStreamManager:
        return self.nc.jsm()

    async def connect(self) -> None:
        """Connect, retrying with back-off until it works; returns early if closed meanwhile.

        Raises `NatsRefused` when the server refuses the credentials or TLS settings before
        the first connection ever succeeded.
        """
        delay = _BACKOFF_START_S
        self._refused = None
        while not self._closing:
            # nats-py retries a refused first connect by itself; a task lets close() stop it.
            client = Client()
            self._attempt = asyncio.create_task(
                client.connect(
                    name=self._name,
                    error_cb=functools.partial(self._on_error, client),
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    closed_cb=self._on_closed,
                    **connect_options(self._config),
                )
            )
            try:
                await self._attempt
                self._nc = client
            except asyncio.CancelledError:
                if self._closing:
                    return
                task = asyncio.current_task()
                if self._refused is not None and not (task is not None and task.cancelling()):
                    raise refused(self._config, self._refused) from None
                raise
            except (TimeoutError, NatsError, NoServersError, OSError) as err:
                log.warning("nats_connect_failed", error=repr(err), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
                continue
            log.info("nats_connected", server=server_address(self._nc.connected_url))
            self._set(True)
            return

    async def close(self) -> None:
        """Flush and close (idempotent); gives up on a flush that cannot finish in time."""
        self._closing = True
        for task in (self._attempt, self._reopen):
            if task is not None and not task.done():
                task.cancel()
        nc = self._nc
        if nc is not None and not nc.is_closed:
            try:
                await asyncio.wait_for(nc.drain(), _CLOSE_TIMEOUT_S)
            except (TimeoutError, NatsError, OSError) as err:
                # Reconnecting or the server is gone: nothing can be flushed any more.
                log.warning("nats_drain_failed", error=repr(err))
                with contextlib.suppress(NatsError, OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(nc.close(), _CLOSE_TIMEOUT_S)
        self._set(False)

    def _set(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            if self._on_change is not None:
                self._on_change(connected)

    async def _on_error(self, client: Client, err: Exception) -> None:
        # The server as `scheme://host:port`: a URL's user info may hold a password.
        server = server_address(current_server(client))
        if self._errors.due(f"{server} {err!r}"):
            log.warning(
                "nats_error", error=repr(err), server=server, held_back=self._errors.held_back
            )
            self._errors.logged()
        reason = refusal(err)
        attempt = self._attempt
        # Only before the first connection: later, credentials may be rotated back.
        if reason is None or self._nc is not None or attempt is None or self._refused is not None:
            return
        self._refused = reason
        attempt.cancel()

    async def _on_disconnected(self) -> None:
        if self._closing:
            log.info("nats_disconnected", closing=True)
        else:
            log.warning("nats_disconnected")
        self._set(False)

    async def _on_reconnected(self) -> None:
        url = self._nc.connected_url if self._nc is not None else None
        log.info("nats_reconnected", server=server_address(url))
        self._errors.reset()
        self._set(True)

    async def _on_closed(self) -> None:
        self._set(False)
        if not self._closing:
            # nats-py closes for good on some protocol errors: start over with a new client.
            log.error("nats_closed_unexpectedly")
            self._reopen = asyncio.create_task(self.connect())
