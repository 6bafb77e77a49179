"""The deterministic simulator against the real machine, and against deliberately broken ones."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsub_dev.sim import MachineFactory, SimParams, SimResult, run
from sidecar.protocol import Output, StreamMachine
from sidecar.protocol.machine import _Attempt


def _check(result: SimResult) -> None:
    assert result.violation is None, result.report()


def _safety_only(seed: int, chaos_ms: int) -> SimParams:
    params = SimParams.draw(random.Random(seed ^ 0x5EED))
    return dataclasses.replace(params, heal_ms=0, chaos_ms=chaos_ms)


def test_many_seeded_safety_runs() -> None:
    totals: dict[str, int] = {}
    for seed in range(1_500):
        result = run(seed, _safety_only(seed, chaos_ms=1_200))
        _check(result)
        for key, value in result.stats.items():
            totals[key] = totals.get(key, 0) + value
    # The schedules really exercised the protocol and the chaos.
    for key in (
        "snapshots",
        "updates",
        "moves",
        "creates",
        "fenced",
        "crashes",
        "failovers",
        "rejected",
    ):
        assert totals[key] > 0, (key, totals)


def test_seeded_runs_with_healing_are_safe_and_live() -> None:
    for seed in range(100):
        _check(run(10_000 + seed))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    regions=st.integers(2, 5),
    subscriptions=st.integers(1, 3),
    latency=st.integers(1, 200),
    cache_size=st.integers(2, 20),
    chaos=st.fixed_dictionaries(
        {
            "stalls": st.booleans(),
            "crashes": st.booleans(),
            "leader_changes": st.booleans(),
            "partitions": st.booleans(),
            "failovers": st.booleans(),
        }
    ),
)
def test_hypothesis_schedules(
    seed: int,
    regions: int,
    subscriptions: int,
    latency: int,
    cache_size: int,
    chaos: dict[str, bool],
) -> None:
    params = SimParams(
        regions=regions,
        subscriptions=subscriptions,
        chaos_ms=1_500,
        heal_ms=4_000,
        max_latency_ms=latency,
        cache_size=cache_size,
        **chaos,
    )
    _check(run(seed, params))


def test_healthy_world_keeps_snapshotting_and_updating() -> None:
    calm = SimParams(
        regions=3,
        stalls=False,
        crashes=False,
        leader_changes=False,
        partitions=False,
        failovers=False,
    )
    result = run(5, calm)
    _check(result)
    assert result.stats["timeouts"] == 0
    assert result.stats["snapshots"] > 20 and result.stats["updates"] > 10


def test_same_seed_same_run() -> None:
    first, second = run(42), run(42)
    assert first.stats == second.stats and first.trace == second.trace
    assert run(43).trace != first.trace


# ---- deliberately broken variants -----------------------------------------------------------


class ReportsLastSequence(StreamMachine):
    def _response_position(self, read_seq: int) -> int:
        return max(read_seq, self._last_seq)


class SingleRound(StreamMachine):
    def _rounds(self) -> int:
        return 1


class IgnoresOwnRequest(StreamMachine):
    def _own_request_seen(self, attempt: _Attempt, round_: int, read_seq: int) -> None:
        attempt.own_seen_round = max(attempt.own_seen_round, round_)


class PartialOnTimeout(StreamMachine):
    def _timed_out(self, attempt: _Attempt) -> list[Output]:
        return self._complete(attempt)


@pytest.mark.parametrize(
    ("factory", "regions", "symptom"),
    [
        (ReportsLastSequence, None, "snapshot r"),
        (SingleRound, 3, "snapshot r"),
        (IgnoresOwnRequest, None, "snapshot r"),
        (PartialOnTimeout, 3, "has no position for"),
    ],
)
def test_simulator_catches_broken_variant(
    factory: MachineFactory, regions: int | None, symptom: str
) -> None:
    for seed in range(100):
        params = SimParams.draw(random.Random(seed ^ 0x5EED), regions=regions)
        result = run(seed, params, factory)
        if result.violation:
            assert symptom in result.violation, result.report()
            report = result.report()
            assert f"seed={seed}" in report and "last events:" in report
            assert len(result.trace) > 10
            return
    pytest.fail(f"{factory.__name__}: no violation in 100 seeds")


def test_partial_snapshot_is_also_caught_by_the_data_property() -> None:
    """Filling the silent region's position in with the request's own slot is still unsafe."""

    class PartialFilled(StreamMachine):
        def _timed_out(self, attempt: _Attempt) -> list[Output]:
            for region in attempt.waiting:
                attempt.positions.setdefault(region, attempt.local_max)
            return self._complete(attempt)

    for seed in range(200):
        params = SimParams.draw(random.Random(seed ^ 0x5EED), regions=3)
        result = run(seed, dataclasses.replace(params, crashes=True), PartialFilled)
        if result.violation:
            assert "has no position" not in result.violation
            return
    pytest.fail("no violation in 200 seeds")


@pytest.mark.slow
def test_long_seeded_sweep() -> None:
    for seed in range(20_000, 23_000):
        _check(run(seed))
