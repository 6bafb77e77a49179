"""Acks above the floor in the runtime's world (docs/protocol.md §6): the durable's
application has slow workers (`ShellParams.slow`: one message of a fetch held, `+WPI`
signalled, acked later), so its floor stays below messages already acked, and those go to
the other regions as ranges. Checked as every update is accepted (`coverage.Coverage`):
what the ranges cover was consumed."""

from __future__ import annotations

import dataclasses

import pytest

from rsub_dev.sim.shell import ShellParams, run_shell
from sidecar.nats import signals
from tests.support.sim_search import caught

# Two regions, the home lost at 6 s: the ranges the home sent are what the new home's exact
# client would skip.
SLOW = ShellParams(
    regions=2,
    interval_ms=200,
    link_delay_ms=30,
    produce_gap_ms=20,
    consume_gap_ms=40,
    consume_batch=5,
    failover_ms=6_000,
    run_ms=12_000,
    slow=0.5,
)
BUDGET = 10


def _drawn(seed: int) -> ShellParams:
    return dataclasses.replace(SLOW, replicas=1 + seed % 2, crashes=seed % 3 == 0)


def test_the_real_runtime_sends_only_consumed_messages_as_acked() -> None:
    totals: dict[str, int] = {}
    for seed in range(4):
        result = run_shell(seed, _drawn(seed))
        assert result.violation is None, result.report()
        for key, value in result.stats.items():
            totals[key] = totals.get(key, 0) + value
    # Slow workers held messages, and ranges above a floor were sent, accepted and checked.
    assert totals["slow_messages"] > 10 and totals["acked_ranges_checked"] > 10, totals


@pytest.fixture
def progress_taken_for_acks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken parse of the ack signals: `+WPI` (work in progress) taken for an ack."""
    settled = signals.settled

    def broken(subject: str, payload: bytes) -> tuple[str, int] | None:
        return settled(subject, b"+ACK" if payload == b"+WPI" else payload)

    monkeypatch.setattr(signals, "settled", broken)


@pytest.mark.usefixtures("progress_taken_for_acks")
def test_the_simulation_catches_work_in_progress_taken_for_an_ack() -> None:
    caught("progress_taken_for_acks", _drawn, BUDGET, "covered:")
