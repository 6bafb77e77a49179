"""The real runtime under deterministic simulation (`rsub_dev.sim.shell`): the shell that
ships keeps its properties over many seeds, runs the same from the same seed, and broken
variants of it, the bugs the real-server campaign found put back, are caught within a
stated budget of seeds."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsub_dev.sim.shell import ShellParams, run_shell
from rsub_dev.sim.shell.ledger import DataId
from rsub_dev.sim.shell.limits import Excuses
from rsub_dev.sim.shell.params import DURABLE
from sidecar.naming import VirtualStream
from sidecar.nats import consumers
from sidecar.nats.effective import EffectivePositions, Floor
from sidecar.nats.origin_log import data_entry
from sidecar.nats.port import JetStreamPort
from sidecar.nats.topology import subject_within
from sidecar.protocol import (
    CreateConsumer,
    CreateCursor,
    Output,
    PositionsListing,
    StreamMachine,
    SubscriptionAction,
)
from sidecar.protocol.machine import _Attempt, _Sub
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime import positions, tails
from sidecar.runtime.driver import StreamDriver
from tests.protocol.broken_machines import (
    AcceptsStaleEpochs,
    CreatedWhenAsked,
    ForgetsTrimPoint,
    IgnoresDeletion,
    IgnoresOwnRequest,
    KeepsLeading,
    PartialOnTimeout,
    PositionFromOwnOrigin,
    ReportsLastSequence,
    ReportsMoveWhenAsked,
    SingleRound,
    TrimsAtIndexEnd,
    TrimsUnrecorded,
    VectorFromHighestSeen,
)
from tests.support.sim_search import caught

# Every broken variant below must be caught within this many seeds (from seed 0).
BUDGET = 60


@pytest.fixture
def rechecks_only_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`move_forward` as it was before seed 866299904591: under the pause it checks only that
    the consumer is still behind, not that one of its messages still lies before the
    position (the look made before the pause stands)."""
    worth = consumers._worth_a_reset
    looked: set[tuple[str, str]] = set()

    async def once(
        port: JetStreamPort,
        stream: str,
        durable: str,
        info: Mapping[str, Any],
        start: int,
        timeout_s: float,
    ) -> bool:
        key = (stream, durable)
        if key in looked:  # the second call of a move: under the pause
            looked.discard(key)
            return consumers._behind(info, start)
        looked.add(key)
        return await worth(port, stream, durable, info, start, timeout_s)

    monkeypatch.setattr(consumers, "_worth_a_reset", once)
    yield


def _drawn(seed: int) -> ShellParams:
    return ShellParams.draw(random.Random(seed ^ 0x5E11))


_NO_EDGES: dict[str, Any] = {
    "write_max_age_ms": 0,
    "read_max_age_ms": 0,
    "write_max_msgs": 0,
    "read_max_msgs": 0,
    "purges": False,
    "twins": 0.0,
    "healed": False,
    "moves": False,
    "run_ms": ShellParams().run_ms,
    "calm_ms": ShellParams().calm_ms,
    "durables": 1,
}


def _core(seed: int) -> ShellParams:
    """What `seed` draws without limits, purges, twins, a healed end (`with_edges`) and
    several durables (`with_durables`): the runs the variants below were first caught in,
    unchanged."""
    return dataclasses.replace(_drawn(seed), **_NO_EDGES)


def _as_found(seed: int) -> ShellParams:
    """What `seed` drew before snapshot timeouts and freezes were drawn too (when seed
    866299904591 was found), and users and outages: the same run."""
    return dataclasses.replace(
        _core(seed),
        timeout_ms=30_000,
        freezes=False,
        resets=False,
        deletions=False,
        outage_ms=0,
    )


def _with_failures(seed: int) -> ShellParams:
    return dataclasses.replace(_core(seed), action_failures=0.3, failover_ms=5_000, outage_ms=0)


def _late_updates(seed: int) -> ShellParams:
    """A failover in three regions while the lost region's last updates are still on their
    way (slow links), the application consuming in the new home at once: moves land on a
    consumer in use."""
    return dataclasses.replace(
        _core(seed),
        regions=3,
        failover_ms=3_000,
        outage_ms=0,
        max_delay_ms=40,
        interval_ms=100,
        link_delay_ms=150,
        consume_gap_ms=10,
        consume_batch=5,
        crashes=False,
        partitions=False,
    )


def _failing_creations(seed: int) -> ShellParams:
    """Three regions, half the consumer requests failing from the start (when the copies
    are created), a failover at 3 s, a short run without crashes or freezes."""
    return dataclasses.replace(
        _core(seed),
        regions=3,
        action_failures=0.5,
        failover_ms=3_000,
        outage_ms=0,
        run_ms=6_000,
        calm_ms=1_500,
        crashes=False,
        freezes=False,
    )


def _lagging_tails(seed: int) -> ShellParams:
    """Two regions, slow links (the own one among them), the marker tails lagging up to
    100 ms behind the data tails and the positions reads: a responder may know its stream's
    end beyond a request it has not read yet."""
    return dataclasses.replace(
        _core(seed),
        regions=2,
        tail_lag_ms=100,
        produce_gap_ms=20,
        interval_ms=100,
        link_delay_ms=150,
        max_delay_ms=2,
        outage_ms=0,
    )


def _users(seed: int) -> ShellParams:
    """Users resetting the durable backwards in its home and deleting it anywhere, with
    failing requests, crashes and freezes."""
    return dataclasses.replace(
        _with_failures(seed), resets=True, deletions=True, crashes=True, freezes=True
    )


def _busy_resets(seed: int) -> ShellParams:
    """Three regions busy enough (a message every 4 ms in each, on average) for the
    sidecars to trim their origin indexes, consumers keeping up, users resetting the durable
    backwards in its home, below what was trimmed; nothing else."""
    return dataclasses.replace(
        _core(seed),
        regions=3,
        resets=True,
        deletions=False,
        crashes=False,
        partitions=False,
        freezes=False,
        garbage=False,
        action_failures=0.0,
        failover_ms=0,
        outage_ms=0,
        produce_gap_ms=4,
        consume_gap_ms=10,
        consume_batch=75,
    )


def _outages(seed: int) -> ShellParams:
    """Users, failing requests, crashes and freezes, then a region out for 3 s: only vectors
    move the copies meanwhile; a shorter run."""
    return dataclasses.replace(
        _users(seed), regions=3, failover_ms=0, outage_ms=3_000, run_ms=11_000, calm_ms=3_000
    )


def _busy_outage(seed: int) -> ShellParams:
    """Busy enough for the indexes to be trimmed, the home's consumer slower than the
    producers, then a region out for 4 s: vectors alone move the copies, and after it the
    region back floods the others."""
    return dataclasses.replace(_busy_resets(seed), resets=False, outage_ms=4_000, consume_batch=5)


def _frozen(seed: int) -> ShellParams:
    """Three replicas per region and freezes alone, short leases and slow requests: a leader
    frozen with a marker under way wakes after another took the stream over, a zombie whose
    marker lands late; a short run."""
    return dataclasses.replace(
        _core(seed),
        freezes=True,
        replicas=3,
        crashes=False,
        partitions=False,
        garbage=False,
        failover_ms=0,
        resets=False,
        deletions=False,
        outage_ms=0,
        lease_ttl_ms=1_000,
        max_delay_ms=40,
        interval_ms=100,
        run_ms=8_000,
        calm_ms=2_000,
    )


def _frozen_longer(seed: int) -> ShellParams:
    """`_frozen`, run twice as long: more freezes per seed, so the zombie whose marker lands
    late comes within fewer seeds (with consumption signs no longer taken after a pause
    longer than a lease, `_frozen` needed 37)."""
    params = _frozen(seed)
    return dataclasses.replace(params, run_ms=2 * params.run_ms)


def _moves(seed: int) -> ShellParams:
    """The application moving to another region and back, every region up, with the
    limits, purges and twins `seed` draws; a short run."""
    return dataclasses.replace(
        _drawn(seed),
        failover_ms=0,
        outage_ms=0,
        moves=True,
        healed=False,
        run_ms=8_000,
        calm_ms=2_000,
    )


def _slow_links(regions: int) -> Callable[[int], ShellParams]:
    """`regions` regions, slow links (the own ones among them: a region may see its own
    request late), a busy stream, short runs without failover."""

    def params(seed: int) -> ShellParams:
        return dataclasses.replace(
            _core(seed),
            regions=regions,
            link_delay_ms=150,
            produce_gap_ms=20,
            interval_ms=100,
            failover_ms=0,
            outage_ms=0,
            run_ms=6_000,
            calm_ms=1_500,
        )

    params.__name__ = f"_slow_links_{regions}"
    return params


# Seeds per kind of run the real runtime must pass: a few in `make test`, many in
# `make sim-variants` (RSUB_SIM_SEEDS).
SEEDS = int(os.environ.get("RSUB_SIM_SEEDS", "2"))


@pytest.mark.parametrize(
    "params",
    [
        _with_failures,
        _late_updates,
        _failing_creations,
        _users,
        _lagging_tails,
        _frozen,
        _slow_links(2),
        _slow_links(3),
    ],
    ids=lambda params: params.__name__,
)
def test_the_real_runtime_keeps_every_property(params: Callable[[int], ShellParams]) -> None:
    """What the broken variants below are caught with, the real shell passes."""
    for seed in range(SEEDS):
        result = run_shell(seed, params(seed))
        assert result.violation is None, result.report()
        assert result.stats.get("consumed", 0) > 0


@pytest.mark.parametrize("params", [_busy_resets, _busy_outage], ids=lambda p: p.__name__)
def test_the_real_runtime_keeps_every_property_in_busy_runs(
    params: Callable[[int], ShellParams],
) -> None:
    """The same over trimmed indexes, user resets and outages (longer runs: one seed in
    `make test`)."""
    for seed in range(max(1, SEEDS // 4)):
        result = run_shell(seed, params(seed))
        assert result.violation is None, result.report()
        assert result.stats["vectors_checked"] > 0


def test_the_real_runtime_keeps_every_property_when_its_application_moves() -> None:
    """The application moving away and back (one seed in `make test`)."""
    for seed in range(max(1, SEEDS // 2)):
        result = run_shell(seed, _moves(seed))
        assert result.violation is None, result.report()
        assert result.stats["app_moves"] == 2, result.stats


def _several(seed: int) -> ShellParams:
    """Two or three durables homed in different regions, a failover at 3 s (each durable
    homed in the lost region continues in another live region, the others stay), failing
    requests and users, a short run."""
    return dataclasses.replace(
        _core(seed),
        durables=2 + seed % 2,
        regions=3,
        failover_ms=3_000,
        outage_ms=0,
        action_failures=0.1,
        resets=True,
        deletions=True,
        run_ms=8_000,
        calm_ms=2_000,
    )


def _several_moving(seed: int) -> ShellParams:
    """Two or three durables, one of them moving away and back, every region up."""
    return dataclasses.replace(_moves(seed), durables=2 + seed % 2)


@pytest.mark.parametrize(
    ("params", "moved"),
    # Homed in r0, r1 (and r2): the failover of r0 moves one durable, the others stay; a
    # move takes one away and back.
    [(_several, {"failovers": 1}), (_several_moving, {"app_moves": 2})],
    ids=lambda v: v.__name__ if callable(v) else "",
)
def test_the_real_runtime_keeps_every_property_of_several_durables(
    params: Callable[[int], ShellParams], moved: dict[str, int]
) -> None:
    for seed in range(max(1, SEEDS // 2)):
        result = run_shell(seed, params(seed))
        assert result.violation is None, result.report()
        assert {k: result.stats.get(k, 0) for k in moved} == moved, result.report()
        assert result.stats["several_durables"] == 1


class ReportsMovesWhenAskedButTheFirst(StreamMachine):
    """`ReportsMoveWhenAsked` for every durable but the first: caught only if the checks
    follow each durable."""

    def _asked(self, sub: _Sub, action: SubscriptionAction) -> None:
        super()._asked(sub, action)
        if action.subscription != DURABLE:
            sub.mark_delete = action.ack_floor


def test_the_checks_follow_every_durable() -> None:
    caught(
        "ReportsMovesWhenAskedButTheFirst",
        _several,
        CORE_BUDGET,
        "reported:",
        machine_factory=ReportsMovesWhenAskedButTheFirst,
    )


def test_seed_9_a_sign_is_not_lost_to_an_index_behind_the_read() -> None:
    """Found once runs drew several durables (seed 9 as `run_shell` draws it: two durables,
    two regions, a return with both regions consuming, the tails lagging up to 100 ms).
    r1's application consumed `app` to 1298 and 1299 at 21,530 and 21,555 ms (data no
    other region had consumed); r1's leader read the durable at 1299 at 21,588 ms (machine
    time) and at 1303 at 21,592 ms, while its origin index stood at 1297: the positions
    reads ran ahead of the data tail, `StreamMachine._consumed_here` saw no data between
    the floor and the position and took no sign, and its floor moved past them, so no later
    read saw that consumption and r1's leader never reported r1 consuming (`consumed in`).
    Fails before main's e9805fa (acks are consumption signs: the acks of 1298 and 1299 now
    sign r1's consumption whatever the index), passes since."""
    result = run_shell(9)
    assert result.violation is None, result.report()


class TakesPurgedFloorsForConsumption(StreamMachine):
    """The machine before seeds 21 and 1067974121501: a move's outcome read back ignores the
    read stream's first sequence read with it, so a floor a purge moved looks consumed."""

    def action_done(
        self,
        action: SubscriptionAction,
        mark_delete: int,
        done_ms: int = 0,
        *,
        first_seq: int = 0,
        lease_epoch: int | None = None,
    ) -> list[Output]:
        return super().action_done(action, mark_delete, done_ms, lease_epoch=lease_epoch)


# Seeds 21 and 1067974121501 caught it until the positions read asked for one more
# `STREAM.INFO` (seed 874624534575): their runs changed and have no purge now. The first two
# of `run_shell`'s own draws with purges that catch it since (of seeds 0 to 409: 174, 247,
# 267, 319).
@pytest.mark.parametrize("seed", [174, 247])
def test_the_simulation_catches_a_purged_floor_taken_for_consumption(seed: int) -> None:
    result = run_shell(seed, machine_factory=TakesPurgedFloorsForConsumption)
    assert result.violation is not None and result.violation.startswith("consumed in:")


def test_seed_21_a_purge_before_a_moves_outcome_gives_no_sign() -> None:
    """Found once runs drew several durables (seed 21 as `run_shell` draws it: three
    durables, a read age limit, purges). r1's sidecar reset its copy of `app-2` (homed in
    r2, never consumed in r1) to 177; an operator purged r1's read stream (1 to 363); the
    reset's outcome read back the copy at 363 (the purge moved it) and `action_done` took
    that for its consumers' sign: its first sequence was still the previous read's (1).
    The class of tests/dev/test_shell_failback.py's accepted seed 776237995758 (a purge
    during a read), through a move's outcome. Fixed: `move_forward` reads the stream's
    first sequence after the outcome, and `action_done` counts nothing at or below it.
    With one more request per positions read (seed 874624534575) the run changed and has no
    purge now; the old machine is caught at seeds 174 and 247 instead."""
    result = run_shell(21)
    assert result.violation is None, result.report()


def test_soak_seed_1067974121501_a_purge_before_a_moves_look_gives_no_sign() -> None:
    """Found by `make soak` (seed 1067974121501, as it draws it): r0's sidecar moved its copy
    of `app-1` (homed in r1, consumed there) to 490; an operator purged r0's read stream (1
    to 561) right before the move's look at the copy, which found its floor at 561 (the
    purge moved it), left it alone and read it back there: taken for r0's consumers' sign.
    Seed 21's class; the first sequence, read after that look, now tells it. With one more
    request per positions read (seed 874624534575) the run changed and has no purge now."""
    rng = random.Random(1067974121501 ^ 0x5E11)
    params = ShellParams.draw(rng).with_failback(rng)
    assert params.purges and params.failback_ms == 7502
    result = run_shell(1067974121501, params)
    assert result.violation is None, result.report()


def test_soak_seed_846308147041_every_region_completes_snapshots_after_healing() -> None:
    """Found by `make soak` (seed 846308147041, as it draws it): three regions, three
    replicas each, links of 150 ms, requests delayed up to 40 ms, tails lagging up to 100 ms,
    three durables whose copies are moved at nearly every read, and a snapshot timeout of
    1,500 ms: r1 completed no snapshot in the 17 s after the heal, its attempts timing out,
    most in their second round. Not a product bug: a round is two hops, out and back, each
    a publish, a link, a marker tail and the reading leader's moves of its last read first
    (a leader carries out a job's outputs before its next job); the same run with a 4 s
    timeout passes, r1's snapshots taking 1.5 to 3 s. A checker gap, fixed: the healed end
    checks that every region completes a snapshot only when the timeout leaves
    `ShellParams.snapshot_rounds_ms` (docs/simulation.md, docs/operations.md); the test
    below runs the seed with that timeout."""
    result = run_shell(846308147041)
    assert result.violation is None, result.report()
    assert result.stats["snapshots_unchecked"] == 1
    assert result.params.timeout_ms < result.params.snapshot_rounds_ms


class IgnoresTheLease(StreamMachine):
    """The machine before seed 702622929322: a read or a move's outcome is a sign whatever
    the lease held over it (`PositionsListing.lease_epoch`), the first read after becoming
    leader the baseline."""

    def _held(self, lease_epoch: int | None) -> bool:
        return True


def test_soak_seed_702622929322_a_woken_replica_takes_no_move_for_consumption() -> None:
    """Found by `make soak` (seed 702622929322, as it draws it) at the end of the fourth
    round on 2026-11-27, and the same at 8202109 (that round's start): three regions, three
    replicas each, freezes, tails lagging up to 300 ms, a failover at 6 s. r2-1-1 led r2
    (epoch 8), read `app` at 13 at 1,125 ms, and its process froze from 1,763 ms for
    5,962 ms (the lease is 3 s); r2-2-1 took the stream over at 5,097 ms (epoch 37) and
    reset `app` seven times, from 321 to 497. r2-1 woke at 7,725 ms; its lease loop, in a
    request since the freeze began, reported the loss only at 7,749 ms, and its machine had
    heard the clock just before (the simulated freeze stops a process's I/O, not its
    timers: its interval loop ticked it at 7,617 ms), so no lease's gap since its last tick
    showed (the rule of seed 161639543428). Its read at 7,725-7,732 ms found `app` at 496
    and its machine took the other replica's resets for r2's consumers' sign ("consumed
    in": none consumed there since 1,125 ms).
    A product bug, fixed: a sign needs a read (or a move and its read back) made wholly
    under the machine's epoch, as the lease said at its start and end, measured from one
    that was too (docs/protocol.md §8). `IgnoresTheLease`, the old rule, was caught here.
    With one more request per positions read (seed 874624534575) the run changed and has no
    such read any more; seed 196 of `run_shell`'s own draws has one: two regions, three
    replicas each, a 3 s lease, tails lagging up to 100 ms. r1-2-2 led r1 (epoch 38) and
    froze at 5,122 ms for 4,465 ms; r1-1-1 took the stream over at 8,093 ms (epoch 66) and
    reset `app` from 951 to 1,170; r1-2 woke at 9,587 ms and its read took those resets for
    r1's consumers' sign under `IgnoresTheLease` (at 9,596 ms, none consumed there since
    5,073 ms). The runtime tells the reads apart: every leader's read carries its epoch but
    that one."""
    reads: Counter[bool] = Counter()

    class CountsHeldReads(StreamMachine):
        def positions_listed(self, listing: PositionsListing) -> list[Output]:
            if self.is_leader:
                reads[listing.lease_epoch == self.epoch] += 1
            return super().positions_listed(listing)

    result = run_shell(196, machine_factory=CountsHeldReads)
    assert result.violation is None, result.report()
    assert reads[False] == 1 and reads[True] > 10, reads
    broken = run_shell(196, machine_factory=IgnoresTheLease)
    assert broken.violation is not None, broken.report()
    assert broken.violation.startswith("consumed in: r1's machine took its consumers' sign")


def test_soak_seed_276089432657_a_durable_its_new_home_cannot_know_is_no_loss() -> None:
    """Found by `make soak SECONDS=300` (seed 276089432657, as it draws it) at the end of the
    fourth round on 2026-11-27: two regions, two replicas each, 150 ms links, read streams
    keeping messages 1,500 ms, a failover at 3 s. r0's only update of `app` that reached r1
    (sent at 1,987 ms; the one at 1,350 ms was dropped as its sender had just handed the
    stream's shard over, the one at 2,991 ms was cut by the failover) was read by r1's
    follower r1-1 at 2,160 ms, while r1's leader r1-0 was frozen (1,929 to 4,388 ms); the
    read stream's max age removed it before r1-0 woke, and r1-0 kept leading. So no replica
    able to create `app` in r1 ever knew it: it stayed absent, and the end check called that
    a loss. A gap of the check, and a stated limit (docs/protocol.md §6, limits; the
    failover runbook's step 2: create it from the start): the check excuses a durable absent
    from its new home only when no replica leading there knows it or was ever fed an update
    naming it, and no marker naming it is left in the read stream.
    With one more request per positions read (seed 874624534575) the run changed: it still
    passes, but no failover is forgotten in it any more, nor in seeds 0 to 999 with its
    parameters. Until a run that forgets one is re-picked, the excuse goes unexercised and
    this test says so (an xfail at that point)."""
    result = run_shell(276089432657)
    assert result.violation is None, result.report()
    if not result.stats.get("failovers_forgotten"):
        pytest.xfail("no failover forgotten since seed 874624534575's added request: to re-pick")
    assert result.stats["failovers_forgotten"] == 1


class NeverCreates(StreamMachine):
    """A machine that knows a durable from updates and never creates it in its region."""

    def _reconcile(self, name: str, sub: _Sub, out: list[Output], *, progress: bool = True) -> None:
        before = len(out)
        super()._reconcile(name, sub, out, progress=progress)
        if any(isinstance(o, CreateConsumer) for o in out[before:]):
            del out[before:]
            sub.moving = False


def test_seed_391_a_leader_that_knows_a_durable_and_never_creates_it_is_a_loss() -> None:
    """The excuse of seed 276089432657 passes no leader that learned the durable: at seed
    391 (a failover, read streams with an age limit, where the `applied` check does not
    stop the run first) a machine that never creates what updates name leaves `app` absent
    from its new home, a loss at the end."""
    assert run_shell(391).violation is None
    result = run_shell(391, machine_factory=NeverCreates)
    assert result.violation == "loss: app is not there in r1, its home now", result.report()


def test_soak_seed_352575333335_a_replica_runs_one_incarnation_at_a_time() -> None:
    """Found by `make soak SECONDS=300` (seed 352575333335, as it draws it, after 101 runs)
    at the end of the fifth round on 2026-11-27: "fencing: r2-0-3 resets app-1 to 149 with
    epoch 0 after it read its region's newer epoch" (at 95273c6, that round's start: vector
    liveness). A bug of the world, not the product: r2-0 crashed at 3,236 ms, r2 went out at
    5,000 ms, the crash's restart came at 5,149 ms (during the outage), and the outage's end
    at 8,677 ms started r2-0 again while that incarnation (r2-0-2) ran: two incarnations of
    one replica shared its port, and r2-0-2's move, as leader under epoch 32, was checked as
    the new incarnation's (epoch 0). A crashed replica now restarts only outside an outage
    (its end starts it), and the world refuses to start a replica that runs."""
    result = run_shell(352575333335)
    assert result.violation is None, result.report()


@pytest.mark.xfail(strict=True, reason="JetStream's consumer reset takes no fencing token")
def test_soak_seed_366258223627_a_reset_under_way_through_a_pause_never_rewinds() -> None:
    """Found by `make soak SECONDS=300` (seed 366258223627, as it draws it, after 27 runs) at
    the end of the fifth round on 2026-11-27 (at 95273c6 the same seed failed otherwise:
    applied): seed 13's limit again. r0-1-1, leader of r0, sent the reset of `app-2` to 149
    at 2,923 ms; its process froze at 2,924 ms for 2,519 ms with the request in its client;
    r0-2-1 took the stream over at 5,274 ms and moved `app-2` to 304; r0-1 woke at 5,443 ms
    and its reset landed: the copy that had delivered to 303 went back to 148 (`rewound`).
    A lease check before the reset cannot cover a pause after it.
    With one more request per positions read (seed 874624534575) the run changed and meets
    the limit no more; seed 24 with the same parameters does: r1-0-1, leader of r1, sent the
    reset of `app` to 272 at 4,739 ms and froze at 4,741 ms for 3,730 ms; r1-2-1 took the
    stream over at 7,421 ms and moved `app` to 471; r1-0 woke at 8,471 ms and its reset
    landed over a copy that had delivered to 470."""
    rng = random.Random(366258223627 ^ 0x5E11)
    params = ShellParams.draw(rng).with_failback(rng)
    result = run_shell(24, params)
    assert result.violation is None, result.report()


def test_soak_seed_874624534575_a_purge_during_a_positions_read_is_no_consumption() -> None:
    """Found by `make soak SECONDS=300` (seed 874624534575, as it draws it, after 151 runs)
    on 2026-11-28 at 93cd2df: two regions, one replica each, a read stream without limits.
    r1's positions read sent its `STREAM.INFO` at 1,511 ms (first sequence 1), listed its
    consumers (`app` at 93, its leader's reset to 94), and the operator purged r1's read
    stream at 1,535 ms (1..100 removed, 13 kept) while the read scanned past the floor:
    the scan found the next message at 102 and put `app` at 101, over removed messages
    only. The read listed the first sequence it began with, and the machine's rule (no
    position at or below the first sequence less one is consumption) let the floor the
    purge moved through: r1's consumers' sign at 1,552 ms, none consumed there since its
    read at 1,370 ms. Only a stream with limits had its first sequence read again after
    its consumers (seed 871902492834), and not after the cursors. Fixed: every positions
    read asks for the first sequence after everything its positions come from
    (`LocalSubscriptions.read`, one more `STREAM.INFO` per read of a stream without
    limits). The run changed with that request and meets no purge during a read any more;
    the runtime as it was is caught at this seed (`first_seq_read_with_the_last`)."""
    result = run_shell(874624534575)
    assert result.violation is None, result.report()


@pytest.fixture
def first_seq_read_with_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """A positions read as it was before seed 874624534575 for a read stream without limits:
    it lists the first sequence its `STREAM.INFO` read with the last, before the consumers
    were listed and scanned, and asks for none after them (the same requests, so the same
    run as `make soak` drew)."""
    began: dict[tuple[int, str], int] = {}
    scan = EffectivePositions.read

    async def noted(
        self: EffectivePositions,
        port: JetStreamPort,
        floors: Mapping[str, Floor],
        last_seq: int,
        *first_seq: int,
    ) -> dict[str, int]:
        if first_seq:  # the durables' scan, given what the read began with (not the cursors')
            began[(id(port), self._stream)] = first_seq[0]
        return await scan(self, port, floors, last_seq, *first_seq)

    async def as_it_began(port: JetStreamPort, stream: str, **_: float) -> int:
        return began[(id(port), stream)]

    monkeypatch.setattr(EffectivePositions, "read", noted)
    monkeypatch.setattr(positions, "stream_first_seq", as_it_began)


@pytest.mark.usefixtures("first_seq_read_with_the_last")
def test_the_simulation_catches_a_purge_during_a_positions_read_taken_for_consumption() -> None:
    """At the seed that found it, and in runs aimed at purges (where the runtime as it was
    failed 3 of seeds 0 to 149 so, 17 the first; the runtime that ships fails none that way)."""
    result = run_shell(874624534575)
    assert result.violation is not None, result.report()
    assert result.violation.startswith("consumed in:"), result.report()
    caught("first_seq_read_with_the_last", _edge(purges=True), CHECKER_BUDGET, "consumed in:")


def test_seed_846308147041_with_a_timeout_that_fits_completes_snapshots_after_healing() -> None:
    """The same run with the shortest timeout the healed end checks: every region
    completes a snapshot after the heal."""
    rng = random.Random(846308147041 ^ 0x5E11)
    drawn = ShellParams.draw(rng).with_failback(rng)
    params = dataclasses.replace(drawn, timeout_ms=drawn.snapshot_rounds_ms)
    result = run_shell(846308147041, params)
    assert result.violation is None, result.report()
    assert result.stats["healed_snapshots"] == 3


def test_seed_18_a_deposed_replica_never_rewinds_the_new_leaders_move() -> None:
    """Found by the shell world (short leases, slow requests, leaders frozen): r1-0-1 froze
    for 856 ms in the middle of `move_forward`, r1-1-1 took the stream over and reset the
    durable to 32; r1-0-1 woke deposed (its lease loop said so at once) and sent the reset
    to 9 it had read the durable for before the new leader's landed: the durable that had
    delivered to 31 went back to 8. The pause does not stop another replica's reset, and
    nothing checked the lease between the steps of a move: `move_forward` now checks it
    right before the reset (also `make soak`'s seed 813830425096)."""
    params = dataclasses.replace(
        _core(18),
        freezes=True,
        replicas=2,
        crashes=False,
        partitions=False,
        garbage=False,
        failover_ms=0,
        resets=False,
        deletions=False,
        outage_ms=0,
        lease_ttl_ms=600,
        run_ms=6_000,
        calm_ms=1_500,
        max_delay_ms=40,
        interval_ms=100,
    )
    result = run_shell(18, params)
    assert result.violation is None, result.report()


@pytest.mark.xfail(strict=True, reason="a product bug: a reset queued before a pause lands late")
def test_seed_13_a_reset_under_way_through_a_pause_never_rewinds_the_new_leaders_move() -> None:
    """Found by the shell world once twins were drawn (seed 13 of `_frozen`, with the
    twins seed 13 draws): r2-2-1, leader of r2, checked its lease and sent the reset of the
    copy to 44 at 3508 ms; its process froze at 3531 ms for 1586 ms (longer than the lease
    of 1000 ms) with the request still in its client (`ProcessNet`: what is under way lands
    once it wakes); r2-1-1 took the stream over at 4851 ms and reset the copy to 91 at
    5056 ms; r2-2 woke at 5117 ms and its reset landed: the copy that had delivered to 90
    went back to 43 (`rewound`). The lease check right before the reset (seed 18's fix)
    cannot cover a pause after it: JetStream's reset takes no fencing token.
    With one more request per positions read (seed 874624534575) the run changed and meets
    the limit no more; seed 70 of `_frozen` with the same twins does (the first of seeds 0
    to 142 so): r1-0-1, leader of r1, sent the reset of `app` to 72 at 2,643 ms and froze
    at 2,655 ms for 1,712 ms; r1-1-1 took the stream over at 4,069 ms and moved `app` to
    230; r1-0 woke at 4,367 ms and its reset landed over a copy that had delivered to 229."""
    params = dataclasses.replace(_frozen(70), twins=0.2811671738563811)
    result = run_shell(70, params)
    assert result.violation is None, result.report()


@pytest.mark.usefixtures("rechecks_only_behind")
def test_the_simulation_catches_the_recheck_under_the_pause_left_out() -> None:
    """Caught at seed 866299904591 (as found) until the positions read asked for one more
    `STREAM.INFO` (seed 874624534575), which changed that run; since, at seed 1054 of
    `run_shell`'s own draws (none of seeds 0 to 171, the first of 1000 to 1080)."""
    result = run_shell(1054)
    assert result.violation is not None and result.violation.startswith("over markers alone:")


def test_seed_866299904591_no_reset_over_markers_after_a_fetch_before_the_pause() -> None:
    """Found by `make soak` on the real runtime: the application fetched the last data
    message before the position between `move_forward`'s look for one and its pause; the
    re-check under the pause looked only at whether the consumer was behind, so the reset
    passed a marker alone and disturbed a consumer in use (the harm of chaos seed 508)."""
    assert run_shell(866299904591, _core(866299904591)).violation is None
    result = run_shell(866299904591, _as_found(866299904591))
    assert result.violation is None, result.report()


# ---- the deleted protocol world's runs (world.py), in the runtime's world ---------------------------------------------


def _everything(seed: int) -> ShellParams:
    """Every kind of chaos at once, two durables, three regions, a failover: short."""
    return dataclasses.replace(
        _core(seed),
        regions=3,
        durables=2,
        replicas=2,
        crashes=True,
        partitions=True,
        garbage=True,
        freezes=True,
        resets=True,
        deletions=True,
        purges=True,
        twins=0.2,
        read_max_age_ms=3_000,
        action_failures=0.2,
        failover_ms=7_000,
        outage_ms=0,
        run_ms=10_000,
        calm_ms=2_000,
    )


def test_every_kind_of_chaos_really_happens() -> None:
    """The protocol world's many seeded safety runs: runs with every kind of chaos on and an outage
    keep every property, and summed over them each kind of chaos, edge and protocol step
    really happened (returns and holds: tests/dev/test_shell_failback.py's `_passes`)."""
    totals: Counter[str] = Counter()
    # Seed 7 since the positions read asks for one more `STREAM.INFO` (seed 874624534575):
    # the runs of the others changed, and none froze a replica any more.
    runs = [(s, _everything(s)) for s in (0, 1, 3, 5, 6, 7)]
    runs.append((2, _outages(2)))
    for seed, params in runs:
        result = run_shell(seed, params)
        assert result.violation is None, result.report()
        totals.update(result.stats)
    for key in (
        "snapshots_checked",
        "vectors_checked",
        "progress_checked",
        "applied_checked",
        "resets",
        "creates",
        "crashes",
        "partitions",
        "junk",
        "freezes",
        "deposed",
        "user_resets",
        "user_deletions",
        "purges",
        "twins",
        "duplicates",
        "failovers",
        "several_durables",
        "outages",
        "vector_advances",
        "consuming_updates",
    ):
        assert totals[key] > 0, (key, sorted(totals.items()))


def test_long_outages_move_copies_by_vectors_alone() -> None:
    """The protocol world's long outages: a region out for 3 s does not answer, so no snapshot started
    meanwhile completes; vectors alone move the live copies (vector liveness is checked),
    and they do move. (The runtime's world has no exact client: the protocol world's count of its
    skips against native duplicates has no counterpart here.)"""
    totals: Counter[str] = Counter()
    for seed in range(SEEDS):
        result = run_shell(seed, _outages(seed))
        assert result.violation is None, result.report()
        totals.update(result.stats)
    assert totals["outages"] == SEEDS, totals
    assert totals["vector_advances"] > 0 and totals["vectors_checked"] > 0, totals


def _wide(regions: int) -> Callable[[int], ShellParams]:
    """The protocol world's runs of four and five regions: three durables, a failover, short."""

    def params(seed: int) -> ShellParams:
        return dataclasses.replace(
            _core(seed),
            regions=regions,
            durables=3,
            replicas=1,
            failover_ms=3_000,
            outage_ms=0,
            run_ms=6_000,
            calm_ms=1_500,
        )

    params.__name__ = f"_wide_{regions}"
    return params


@pytest.mark.parametrize("params", [_wide(4), _wide(5)], ids=lambda p: p.__name__)
def test_the_real_runtime_keeps_every_property_in_four_and_five_regions(
    params: Callable[[int], ShellParams],
) -> None:
    result = run_shell(0, params(0))
    assert result.violation is None, result.report()
    assert result.stats["snapshots_checked"] > 0 and result.stats["failovers"] > 0


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    regions=st.integers(2, 5),
    durables=st.integers(1, 3),
    link_delay_ms=st.sampled_from([5, 30, 150]),
    failover_ms=st.sampled_from([0, 2_000]),
    chaos=st.fixed_dictionaries(
        {
            "crashes": st.booleans(),
            "partitions": st.booleans(),
            "freezes": st.booleans(),
            "garbage": st.booleans(),
            "resets": st.booleans(),
            "deletions": st.booleans(),
        }
    ),
)
def test_hypothesis_schedules(
    seed: int,
    regions: int,
    durables: int,
    link_delay_ms: int,
    failover_ms: int,
    chaos: dict[str, bool],
) -> None:
    """The protocol world's hypothesis schedules, as the runtime's world's parameters (few examples:
    a run costs seconds here)."""
    params = ShellParams(
        regions=regions,
        durables=durables,
        link_delay_ms=link_delay_ms,
        failover_ms=failover_ms,
        run_ms=4_000,
        calm_ms=1_500,
        **chaos,
    )
    result = run_shell(seed, params)
    assert result.violation is None, result.report()


def test_a_calm_world_keeps_snapshotting_and_updating() -> None:
    """The protocol world's healthy world: no chaos, every snapshot completes and updates go out."""
    calm = dataclasses.replace(
        _core(5),
        regions=3,
        crashes=False,
        partitions=False,
        freezes=False,
        garbage=False,
        resets=False,
        deletions=False,
        action_failures=0.0,
        failover_ms=0,
        outage_ms=0,
        run_ms=8_000,
    )
    result = run_shell(5, calm)
    assert result.violation is None, result.report()
    assert result.stats["snapshots_checked"] > 20 and result.stats["vectors_checked"] > 10


def test_seed_860853044175_a_move_failed_after_its_user_deleted_the_durable_is_not_owed() -> None:
    """The protocol world's seed 860853044175 (issue 19): two regions, users deleting the durable, half
    the consumer requests failing; a move that failed after its user deleted the durable is
    not owed (retried), the next update creates it again."""
    seed = 860853044175
    params = dataclasses.replace(
        _core(seed),
        regions=2,
        deletions=True,
        action_failures=0.5,
        crashes=False,
        partitions=False,
        freezes=False,
        resets=False,
        garbage=False,
        failover_ms=6_000,
        outage_ms=0,
    )
    result = run_shell(seed, params)
    assert result.violation is None, result.report()
    assert result.stats["user_deletions"] > 0, result.stats


def test_same_seed_same_run() -> None:
    first, second = run_shell(3), run_shell(3)
    assert first.trace == second.trace and first.stats == second.stats
    assert run_shell(4).trace != first.trace


def test_same_seed_same_run_in_another_process() -> None:
    """Byte for byte, whatever the process's string hashing (sets and dicts of names)."""
    script = (
        "from rsub_dev.sim.shell import run_shell; "
        "r = run_shell(3, trace_len=100_000); print('\\n'.join(r.trace)); print(sorted(r.stats.items()))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            check=True,
        ).stdout
        for hash_seed in (1, 2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) > 1_000


class ReportsBeforeTheMove(StreamDriver):
    """Reports a move or creation done at the position asked for, before (and whatever) its
    outcome: the API answers a position the durable does not have (seeds 7 and 524 of the
    real-server campaign)."""

    async def _carry_out(
        self, machine: StreamMachine, output: Output, outputs: deque[Output]
    ) -> None:
        if isinstance(output, SubscriptionAction):
            outputs.extend(machine.action_done(output, output.ack_floor))
            await self._effects.carry_out(machine, output)
            return
        await super()._carry_out(machine, output, outputs)


class ForgetsAFailedCreation(StreamDriver):
    """Never reports a failed creation: the machine waits for its outcome forever and never
    asks for it again (seed 18)."""

    async def _carry_out(
        self, machine: StreamMachine, output: Output, outputs: deque[Output]
    ) -> None:
        if isinstance(output, CreateConsumer | CreateCursor):
            read_back = await self._effects.carry_out(machine, output)
            if read_back is not None:
                outputs.extend(machine.action_done(output, read_back.mark_delete))
            return
        await super()._carry_out(machine, output, outputs)


@pytest.fixture
def resets_over_markers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`move_forward` without its look for a message the consumer delivers before the
    position: it resets a consumer in use over markers alone (seed 508)."""

    async def nothing_before(*_: object, **__: object) -> int:
        return 0

    monkeypatch.setattr(consumers, "first_delivered", nothing_before)
    yield


@pytest.fixture
def resets_unpaused(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`move_forward` reads the durable, then resets it, without holding it paused between:
    a client fetching between the two is rewound."""

    async def not_paused(*_: object, **__: object) -> bool:
        return False

    monkeypatch.setattr(consumers, "_pause", not_paused)
    yield


@pytest.mark.parametrize(
    ("variant", "params", "symptom"),
    [
        (ReportsBeforeTheMove, _with_failures, "reported:"),
        # The update that names the region is accepted, its creation never carried out
        # (applied), nor asked for again: the application failing over finds none (loss).
        (ForgetsAFailedCreation, _failing_creations, ("applied:", "loss:")),
    ],
)
def test_the_simulation_catches_a_broken_driver(
    variant: type[StreamDriver],
    params: Callable[[int], ShellParams],
    symptom: str | tuple[str, ...],
) -> None:
    caught(variant.__name__, params, BUDGET, symptom, driver_factory=variant)


@pytest.mark.parametrize(
    ("patch", "params", "symptom"),
    [
        ("resets_over_markers", _core, "over markers alone:"),
        ("resets_unpaused", _late_updates, "rewound:"),
    ],
)
def test_the_simulation_catches_a_broken_move(
    patch: str,
    params: Callable[[int], ShellParams],
    symptom: str,
    request: pytest.FixtureRequest,
) -> None:
    request.getfixturevalue(patch)
    caught(patch, params, BUDGET, symptom)


# ---- the core's broken machines, run in the real runtime ----------------------------------
# The variants of tests/protocol/broken_machines.py (kept as they were) restored by every
# sidecar's driver (`StreamDriver(machine_factory=...)`): each must be caught within this
# many seeds (from seed 0).
CORE_BUDGET = 100


@pytest.mark.parametrize(
    ("machine", "params", "symptom"),
    [
        (SingleRound, _slow_links(3), "snapshot "),
        (IgnoresOwnRequest, _slow_links(2), "snapshot "),
        (PartialOnTimeout, _core, "snapshot "),
        (VectorFromHighestSeen, _core, "claim 1:"),
        (TrimsUnrecorded, _core, "claim 1:"),
        (PositionFromOwnOrigin, _core, "moved over unconsumed data:"),
        (ReportsMoveWhenAsked, _core, "reported:"),
        (AcceptsStaleEpochs, _frozen_longer, "fencing:"),
        (KeepsLeading, _frozen, "fencing:"),
        (CreatedWhenAsked, _failing_creations, "retried:"),
        (IgnoresDeletion, _users, "reported:"),
        (ForgetsTrimPoint, _busy_resets, "claim 1:"),
        (TrimsAtIndexEnd, _busy_outage, "vector liveness:"),
        (ReportsLastSequence, _lagging_tails, "snapshot "),
    ],
)
def test_the_runtime_world_catches_a_broken_machine(
    machine: type[StreamMachine], params: Callable[[int], ShellParams], symptom: str
) -> None:
    caught(machine.__name__, params, CORE_BUDGET, symptom, machine_factory=machine)


def test_a_lost_lease_steps_down_the_machine_the_driver_runs() -> None:
    """The driver steps a replica down through its own machine's `became_follower` (a
    variant's override included), not `StreamMachine`'s: in a calm run with two replicas
    per region nobody leads and loses it, so only the lease's reports step anyone down."""
    stepped: list[int] = []

    class Recorded(StreamMachine):
        def became_follower(self) -> list[Output]:
            stepped.append(self.epoch)
            return super().became_follower()

    calm = dataclasses.replace(_frozen(0), freezes=False, action_failures=0.0, run_ms=3_000)
    result = run_shell(0, calm, machine_factory=Recorded)
    assert result.violation is None, result.report()
    assert len(stepped) >= calm.regions, stepped


# ---- the checker itself: each edge case really happens and is told apart from loss ---------
# The deleted test_protocol_sim.py's checker tests, re-expressed against the runtime's world: its excuses
# (`rsub_dev.sim.shell.limits.Excuses`) made narrower, each must then find a loss in runs
# aimed at its edge case, within this many seeds (from seed 0).
CHECKER_BUDGET = 30


def _edge(**changes: Any) -> Callable[[int], ShellParams]:
    """Drawn runs with one edge case on (and the others off), two regions, one replica
    each, short, no chaos but what `changes` turns on, the home's consumer slower than its
    producers (it lags behind what limits remove)."""

    def params(seed: int) -> ShellParams:
        return dataclasses.replace(
            _core(seed),
            **_NO_EDGES
            | {
                "regions": 2,
                "replicas": 1,
                "failover_ms": 0,
                "outage_ms": 0,
                "run_ms": 6_000,
                "calm_ms": 1_500,
                "produce_gap_ms": 20,
                "consume_gap_ms": 100,
                "consume_batch": 1,
                "crashes": False,
                "freezes": False,
                "partitions": False,
                "resets": False,
                "deletions": False,
                "garbage": False,
            }
            | changes,
        )

    params.__name__ = "_edge_" + "_".join(changes)
    return params


class PhysicalCopies(Excuses):
    """Counts consumption per copy instead of per logical message (`Nats-Msg-Id`)."""

    def consumed(self, data: DataId) -> bool:
        return bool(self._consumed[data])


class NoExcuse(Excuses):
    """Excuses no pass of a message never consumed, removed by limits or not."""

    def why(self, data: DataId) -> str | None:
        return None


class NoPurgeExcuse(Excuses):
    """Does not count a purge of a read stream as passing what it removed there."""

    def excuse_purged(self, copy: DataId, x: str, at: int) -> str | None:
        return None


@pytest.mark.parametrize(
    ("excuses", "params"),
    [
        # Proof case 2 happens: vectors cover copies never consumed whose twins were.
        (PhysicalCopies, _edge(twins=0.3)),
        # Passes of messages that never reached a read stream (a region cut off for longer
        # than its write stream keeps them) happen, and are told from loss.
        (
            NoExcuse,
            _edge(write_max_age_ms=1_000, partitions=True, consume_gap_ms=40, consume_batch=5),
        ),
        (NoExcuse, _edge(write_max_msgs=40, partitions=True, consume_gap_ms=40, consume_batch=5)),
        # Passes of messages removed under a consumer, by age or count, told from loss.
        (NoExcuse, _edge(read_max_age_ms=1_500)),
        (NoExcuse, _edge(read_max_msgs=60)),
        # A purge moves every consumer of the stream over what it removes, idle ones too.
        (NoPurgeExcuse, _edge(purges=True)),
    ],
    ids=lambda v: v.__name__,
)
def test_the_checker_tells_edge_cases_from_loss(
    excuses: type[Excuses], params: Callable[[int], ShellParams]
) -> None:
    symptoms = ("moved over unconsumed data:", "covered:", "loss:")
    caught(excuses.__name__, params, CHECKER_BUDGET, symptoms, excuses=excuses)


def test_the_real_runtime_keeps_every_property_at_the_edges() -> None:
    """What the checker's tests above find a loss in with narrower excuses, the real
    runtime passes with the documented ones: every edge at once (one seed in `make test`)."""
    for seed in range(max(1, SEEDS // 2)):
        result = run_shell(seed, _every_edge(seed))
        assert result.violation is None, result.report()
        assert result.stats["twins"] and result.stats["excused_removed"], result.stats


_every_edge = _edge(
    twins=0.3, write_max_age_ms=1_000, read_max_msgs=60, purges=True, partitions=True
)


class CountsRemovedMessages(StreamMachine):
    """Takes a floor that followed the read stream's removals for consumption (the rule the
    edges' seed 0 called for, `PositionsListing.first_seq`, left out)."""

    def positions_listed(self, listing: PositionsListing) -> list[Output]:
        return super().positions_listed(dataclasses.replace(listing, first_seq=0))


def test_the_simulation_catches_removals_taken_for_consumption() -> None:
    caught(
        "CountsRemovedMessages",
        _every_edge,
        CHECKER_BUDGET,
        "consumed in:",
        machine_factory=CountsRemovedMessages,
    )


# The deleted test_protocol_sim.py's HomeOnlyRemoval (a removal counted as passed only under the home's
# copy) is not re-expressed: it finds no loss in the runtime's world. With the excuse
# narrowed to removals in r0 (the first home), 22 seeds of `_edge(read_max_age_ms=1_500,
# link_delay_ms=150)` passed: ten as they are, six with three regions, six with a failover
# at 3 s; the removals the home's vectors skipped lay under the home's copy too.


@pytest.fixture
def feeds_snapshot_markers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The origins tail reads every subject of the read stream, so the local snapshot
    markers (no `Nats-Stream-Source`) are fed to the index as data of no known origin."""

    async def every_message(
        port: JetStreamPort,
        vs: VirtualStream,
        region: str,
        start_seq: int,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[DataEntry, None]:
        messages = port.read(
            vs.read_stream(region), ">", start_seq, live=True, headers_only=True, opened=opened
        )
        async for msg in messages:
            entry = data_entry(vs, msg.seq, msg.headers)
            if entry.origin == UNKNOWN_ORIGIN or subject_within(msg.subject, vs.data_filter()):
                yield entry

    monkeypatch.setattr(tails, "tail_origins", every_message)
    yield


@pytest.fixture
def reads_through_the_next_data(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The effective position one message too far: through the first data message after
    the floor (the scan's answer taken as consumed, an off-by-one)."""
    known = EffectivePositions.known

    def one_too_far(self: EffectivePositions, name: str, floor: Floor, last_seq: int) -> int:
        return min(known(self, name, floor, last_seq) + 1, last_seq)

    monkeypatch.setattr(EffectivePositions, "known", one_too_far)
    yield


@pytest.mark.parametrize(
    ("patch", "symptoms"),
    [
        ("feeds_snapshot_markers", ("not data:",)),
        # What it claims is more than the copy has: reported, a move over what the home
        # never consumed, or its durable's position read past data nobody consumed there
        # taken for its consumers' (the failback world's consumed-in check).
        (
            "reads_through_the_next_data",
            ("reported:", "moved over unconsumed data:", "covered:", "consumed in:"),
        ),
    ],
)
def test_the_checker_catches_a_runtime_reading_its_stream_wrong(
    patch: str, symptoms: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue(patch)
    caught(patch, _core, CHECKER_BUDGET, symptoms)


# ---- liveness once healed ---------------------------------------------------------------


def _healed(seed: int) -> ShellParams:
    """A healed end after chaos that cuts regions off (snapshot attempts time out), short
    snapshot timeouts and leases (a shorter end), no failover or outage (every region
    live)."""
    return dataclasses.replace(
        _drawn(seed),
        partitions=True,
        timeout_ms=1_500,
        lease_ttl_ms=1_000,
        failover_ms=0,
        outage_ms=0,
    ).with_healed_end()


class GivesUpAfterATimeout(StreamMachine):
    """Starts no snapshot again once an attempt timed out: safe, but no copy moves by a
    snapshot from then on."""

    gave_up = False

    def _timed_out(self, attempt: _Attempt) -> list[Output]:
        self.gave_up = True
        return super()._timed_out(attempt)

    def _should_start(self) -> bool:
        return not self.gave_up and super()._should_start()


class SendsOneUpdate(StreamMachine):
    """Sends a subscription's first update only: safe, but the copies elsewhere stay where
    that one put them."""

    def _maybe_send_update(
        self, name: str, sub: _Sub, out: list[Output], *, now: bool = False
    ) -> None:
        if sub.last_sent is None:
            super()._maybe_send_update(name, sub, out, now=now)


@pytest.mark.parametrize(
    ("machine", "symptom"),
    [(GivesUpAfterATimeout, "liveness: r"), (SendsOneUpdate, "liveness: app")],
)
def test_the_healed_end_catches_a_machine_that_stops_making_progress(
    machine: type[StreamMachine], symptom: str
) -> None:
    caught(machine.__name__, _healed, CHECKER_BUDGET, symptom, machine_factory=machine)


@pytest.mark.timeout(60)
def test_soak_seed_108632163667_a_freeze_cut_short_by_the_healed_end_wakes_its_sidecar() -> None:
    """Found by `make soak SECONDS=300` on 2026-11-28 (at f02fda8): the run never ended (an
    hour of virtual time after its 22.6 s, leases renewing). r0-0 froze at 5,262 ms for
    5,978 ms; r0 was lost at 6 s, its sidecar's stop waiting for the frozen requests; the
    healed end cancelled the chaos at 9 s, inside the freeze's sleep, so the sidecar never
    woke and the failover's stop never returned. A bug of the world: a freeze now always
    wakes its sidecar, cut short or not."""
    result = run_shell(108632163667)
    assert result.violation is None, result.report()
    assert result.stats["heals"] == 1


def test_soak_seed_479096479710_a_purge_before_a_reset_lands_rewinds_nothing() -> None:
    """Found by `make soak SECONDS=300` on 2026-11-28 (at ce3d468; the helper of seed
    874624534575's fix had seen the same class in 3 of 150 purge runs, before and after it):
    the operator purged r1's read stream (1..108 removed) between r1's move's last check of
    `app` and its reset to 50; the purge had moved the consumer to 108, and the check took
    the reset for a rewind (and then for a reset over markers alone). Nothing still stored
    lay between 50 and 108, so nothing could be delivered again. A checker fault: a rewind
    counts only over messages still stored, and a reset landing past removed messages only
    is counted apart (`resets_after_removals`)."""
    result = run_shell(479096479710)
    assert result.violation is None, result.report()
    assert result.stats["resets_after_removals"] == 1
