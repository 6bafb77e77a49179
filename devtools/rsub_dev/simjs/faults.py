"""Faults the simulated JetStream injects into its operations when told to.

Every operation (`Op`) names a target: the stream for stream and consumer operations, the
bucket's stream (`KV_<bucket>`) for key-value ones. Before it runs, `Faults.check` raises what the first matching rule
says, in the order the rules were added:

- `fail_next(op, fault, target=..., times=n)`: the next `n` matching calls fail;
- `fail_randomly(probability, faults, ops=..., targets=...)`: each matching call fails with
  that probability, the fault drawn among `faults`; both draws come from the `random.Random`
  the `Faults` was given (and only when a random rule matches, so adding one does not shift
  the draws of a run that never reaches it);
- `lose_meta_leader(cluster)`: until `restore_meta_leader`, the operations a real server
  answers only with a JetStream meta leader (`NEEDS_META`) fail with 503 on targets placed in
  that cluster (None: those placed nowhere in particular), as a region cut from most of the
  super-cluster answers. Publishes, fetches, acks, consumer info, resets and key-value reads
  and writes still work there, as on a real server.

What each `Fault` raises, as the real server and nats-py do:

- `ERROR`: a 500 API error (`CLUSTER_NOT_LEADER`, what a request meets during an election);
- `TIMEOUT`: `SimTimeout`, nothing done;
- `REPLY_LOST`: the operation is done, then `SimTimeout` (its reply was lost);
- `NOT_FOUND`: what the operation raises when its target does not exist, as the real
  server answers: a stream or consumer "not found", a key not found, a publish no
  responders; a reset of a consumer that does not exist times out (nothing answers it), a
  pull from one gets the bare 503 status of no responders;
- `UNAVAILABLE`: a 503 (`CLUSTER_NOT_AVAILABLE`, no meta leader).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from rsub_dev.simjs.errors import (
    CLUSTER_NOT_LEADER,
    SimJSError,
    SimTimeout,
    api_error,
    unavailable,
)


class Op(StrEnum):
    STREAM_CREATE = "stream_create"
    STREAM_UPDATE = "stream_update"
    STREAM_NAMES = "stream_names"
    STREAM_DELETE = "stream_delete"
    STREAM_INFO = "stream_info"
    STREAM_PURGE = "stream_purge"
    PUBLISH = "publish"
    MSG_GET = "msg_get"
    CONSUMER_CREATE = "consumer_create"
    CONSUMER_INFO = "consumer_info"
    CONSUMER_LIST = "consumer_list"
    CONSUMER_DELETE = "consumer_delete"
    CONSUMER_PAUSE = "consumer_pause"
    CONSUMER_RESET = "consumer_reset"
    FETCH = "fetch"
    ACK = "ack"
    KV_GET = "kv_get"
    KV_PUT = "kv_put"
    KV_CREATE = "kv_create"
    KV_UPDATE = "kv_update"
    KV_DELETE = "kv_delete"
    KV_PURGE = "kv_purge"


# Answered only with a meta leader (nats-server `jetstream_api.go`, the handlers that check
# `isLeaderless`); the others go to a stream or consumer leader, or are direct gets.
NEEDS_META = frozenset(
    {
        Op.STREAM_CREATE,
        Op.STREAM_UPDATE,
        Op.STREAM_NAMES,
        Op.STREAM_DELETE,
        Op.STREAM_INFO,
        Op.STREAM_PURGE,
        Op.MSG_GET,
        Op.CONSUMER_CREATE,
        Op.CONSUMER_LIST,
        Op.CONSUMER_DELETE,
        Op.CONSUMER_PAUSE,
    }
)


class Fault(StrEnum):
    ERROR = "error"
    TIMEOUT = "timeout"
    REPLY_LOST = "reply_lost"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"


@dataclass(slots=True)
class _Rule:
    faults: tuple[Fault, ...]
    ops: frozenset[Op] | None
    targets: frozenset[str] | None
    remaining: int | None  # None: a random rule, unlimited
    probability: float = 1.0

    def covers(self, op: Op, target: str) -> bool:
        return (self.ops is None or op in self.ops) and (
            self.targets is None or target in self.targets
        )


class Faults:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng
        self._rules: list[_Rule] = []
        self._meta_lost: set[str | None] = set()
        self.injected: dict[Fault, int] = dict.fromkeys(Fault, 0)
        """How many faults of each kind were injected (meta leader losses as UNAVAILABLE)."""
        self._suspended = False

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """No fault at all within (not even drawn): a simulation's own users acting, whose
        requests are not the subject."""
        self._suspended, before = True, self._suspended
        try:
            yield
        finally:
            self._suspended = before

    def fail_next(self, op: Op, fault: Fault, *, target: str | None = None, times: int = 1) -> None:
        if times < 1:
            raise ValueError(f"times must be positive, got {times}")
        targets = None if target is None else frozenset({target})
        self._rules.append(_Rule((fault,), frozenset({op}), targets, times))

    def fail_randomly(
        self,
        probability: float,
        faults: Sequence[Fault],
        *,
        ops: Collection[Op] | None = None,
        targets: Collection[str] | None = None,
    ) -> None:
        if self._rng is None:
            raise ValueError("random faults need the random.Random this Faults was given")
        if not 0 < probability <= 1 or not faults:
            raise ValueError(f"need a probability in (0, 1] and faults, got {probability}")
        self._rules.append(
            _Rule(
                tuple(faults),
                None if ops is None else frozenset(ops),
                None if targets is None else frozenset(targets),
                None,
                probability,
            )
        )

    def clear(self) -> None:
        """Forget every rule (a meta leader lost stays lost)."""
        self._rules.clear()

    def lose_meta_leader(self, cluster: str | None) -> None:
        self._meta_lost.add(cluster)

    def restore_meta_leader(self, cluster: str | None) -> None:
        self._meta_lost.discard(cluster)

    def check(self, op: Op, target: str, cluster: str | None) -> Fault | None:
        """The fault to inject into this call, if any: raises it when it is an error raised
        before the operation; returns NOT_FOUND and REPLY_LOST (the caller raises them, after
        the operation for REPLY_LOST)."""
        if self._suspended:
            return None
        if op in NEEDS_META and cluster in self._meta_lost:
            self.injected[Fault.UNAVAILABLE] += 1
            raise unavailable()
        fault = self._draw(op, target)
        if fault is None:
            return None
        self.injected[fault] += 1
        if fault in (Fault.NOT_FOUND, Fault.REPLY_LOST):
            return fault
        raise _error(fault)

    def _draw(self, op: Op, target: str) -> Fault | None:
        for rule in self._rules:
            if not rule.covers(op, target):
                continue
            if rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining == 0:
                    self._rules.remove(rule)
                return rule.faults[0]
            assert self._rng is not None
            if self._rng.random() < rule.probability:
                return self._rng.choice(rule.faults)
        return None


def _error(fault: Fault) -> SimJSError:
    if fault is Fault.TIMEOUT:
        return SimTimeout()
    if fault is Fault.UNAVAILABLE:
        return unavailable()
    return api_error(500, CLUSTER_NOT_LEADER, "JetStream cluster can not handle request")
