"""The chaos campaign (devtools/rsub_dev/chaos, docs/reliability.md) in CI: one short seed on
a real three-servers-per-region super-cluster must pass, and the checker must reject the
same recorded history once it is broken in each way a rule forbids."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.js.api import ConsumerInfo

from rsub_dev.chaos.checker import Violation, check
from rsub_dev.chaos.history import (
    Delivery,
    History,
    Position,
    Removal,
    UserDeletion,
)
from rsub_dev.chaos.run import Outcome, leader_floor, run_seed

pytestmark = pytest.mark.integration

# A seed whose short schedule mixes several kinds of faults with failovers (plan.draw).
SEED = 3
SECONDS = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return await run_seed(SEED, SECONDS, tmp_path_factory.mktemp("chaos") / "run", keep=True)


@pytest.fixture
def history(outcome: Outcome) -> History:
    """A fresh copy of the run's recorded history."""
    return History.from_json((outcome.directory / "history.json").read_text())


def rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_short_seed_passes_every_rule(outcome: Outcome, history: History) -> None:
    print(outcome.summary)
    assert [str(v) for v in outcome.violations] == []
    assert history.faults, "the seed injected no fault"
    assert history.failovers, "the seed moved no consumer"
    assert history.deliveries and history.positions


def test_a_skipped_message_is_loss(history: History) -> None:
    victim = history.deliveries[len(history.deliveries) // 2]
    history.deliveries = [
        d
        for d in history.deliveries
        if not (d.durable == victim.durable and d.payload == victim.payload)
    ]
    assert "no_loss" in rules(check(history))
    # The same message removed by a purge before it was delivered is excused, exactly.
    history.removals.append(
        Removal(victim.region, victim.at, 0, [victim.payload], {victim.durable: [victim.payload]})
    )
    assert "no_loss" not in rules(check(history))


def test_a_delivered_marker_is_caught(history: History) -> None:
    delivery = history.deliveries[0]
    marker = dataclasses.replace(delivery, subject=f"_rsub.{history.stream}.marker.x")
    history.deliveries.append(marker)
    assert rules(check(history)) == {"no_marker"}


def move_last_floor_back(history: History) -> Position:
    """Append a read of the latest nonzero consumer floor, one lower and one to two seconds
    after it; returns the read it moves back from."""
    last = max(
        (p for p in history.positions if p.floor > 0 and p.source == "consumer"),
        key=lambda p: p.started,
    )
    back = Position(
        last.durable, last.region, last.at + 1, last.at + 2, last.floor - 1, last.source
    )
    history.positions.append(back)
    return last


def test_a_floor_moving_back_is_caught_unless_its_user_deleted_it(history: History) -> None:
    last = move_last_floor_back(history)
    assert "forward_only" in rules(check(history))
    history.deletions.append(UserDeletion(last.durable, last.region, last.at + 1.5))
    assert "forward_only" not in rules(check(history))


def test_a_deletion_excuses_a_floor_moving_back_only_if_it_may_lie_between(
    history: History,
) -> None:
    """A deletion known to have happened between its request (`at`) and when it was seen
    done (`until`): seed 72's request timed out, the durable was gone all the same."""
    last = move_last_floor_back(history)
    # Done before the floor was read: the floor moved back after it, not across it.
    history.deletions.append(
        UserDeletion(last.durable, last.region, last.started - 9, last.started - 1)
    )
    assert "forward_only" in rules(check(history))
    # Sent before that read, seen done after it: it may lie between the two reads.
    history.deletions[-1] = UserDeletion(last.durable, last.region, last.started - 9, last.at + 1.5)
    assert "forward_only" not in rules(check(history))


def consumer_info(floor: int, cluster: dict[str, Any] | None) -> ConsumerInfo:
    """A `CONSUMER.INFO` answer as nats-server 2.15 shapes it."""
    zero = {"consumer_seq": 0, "stream_seq": 0}
    response: dict[str, Any] = {
        "stream_name": "orders-read-west",
        "name": "app0",
        "created": "2026-11-23T17:13:24.000000000Z",
        "config": {"durable_name": "app0", "ack_policy": "explicit"},
        "delivered": {"consumer_seq": floor, "stream_seq": floor} if floor else zero,
        "ack_floor": {"consumer_seq": floor, "stream_seq": floor} if floor else zero,
        "num_ack_pending": 0,
        "num_redelivered": 0,
        "num_waiting": 0,
        "num_pending": 0,
        "ts": "2026-11-23T17:13:46.560000000Z",
    }
    if cluster is not None:
        response["cluster"] = cluster
    info: ConsumerInfo = ConsumerInfo.from_response(response)
    return info


def test_a_floor_is_recorded_only_from_the_consumers_leader() -> None:
    """Chaos seed 33: a replica restarting after a region kill answered `CONSUMER.INFO` with
    its configuration and an empty state (no cluster information), read as floor 0 after
    419; the consumer's leader said 450 once elected. A replica of a consumer without a
    leader can answer too, with no leader named. Neither is a position."""
    leader = {"name": "west", "leader": "west-2", "raft_group": "C-R3F-x"}
    assert leader_floor(consumer_info(450, leader)) == 450
    assert leader_floor(consumer_info(0, leader)) == 0  # a real floor 0 is recorded
    assert leader_floor(consumer_info(0, None)) is None
    assert leader_floor(consumer_info(450, {"name": "west", "raft_group": "C-R3F-x"})) is None


def test_a_message_delivered_again_from_below_the_reported_position_is_caught(
    history: History,
) -> None:
    failover = next(f for f in history.failovers if f.view is not None)
    assert failover.view is not None
    before = [
        d for d in history.deliveries if d.durable == failover.durable and d.stint < failover.stint
    ]
    assert before, "the failover moved a consumer that had consumed nothing"
    # Delivered again after the failover from a sequence the target said was consumed.
    rewound = dataclasses.replace(
        before[-1],
        stint=failover.stint,
        region=failover.target,
        read_seq=failover.view.mark_delete,
        at=failover.at + 1,
    )
    history.deliveries.append(rewound)
    assert rules(check(history)) == {"duplicates"}
    # The same message delivered again from above that position is an expected duplicate.
    history.deliveries[-1] = dataclasses.replace(rewound, read_seq=failover.view.mark_delete + 1)
    assert check(history) == []


def test_a_sidecar_not_ready_after_the_heal_is_caught(history: History) -> None:
    history.sidecars_ready[history.regions[0]] = False
    assert "survived" in rules(check(history))
    history.sidecars_ready[history.regions[0]] = True
    history.snapshots_after_heal[history.regions[-1]] = False
    assert "survived" in rules(check(history))


def test_the_history_round_trips_through_json(outcome: Outcome, history: History) -> None:
    assert History.from_json(history.to_json()) == history
    assert isinstance(history.deliveries[0], Delivery)
    assert Path(outcome.directory / "history.json").exists()
