"""What a run of the runtime's world is made of, drawn from its seed."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

STREAM = "orders"
MOVE_PAUSE_MS = 10_000
"""How long `consumers.move_forward` pauses a durable it moves (its `_MOVE_PAUSE_S`): a
pause of any other length is the failback guard's."""
DURABLE = "app"
"""The first replicated durable's name (homed in the first region); the others' are
`durable_names`."""
SHARDS = 4
DEDUP_WINDOW_MS = 120_000
OUTAGE_AT_MS = 5_000


def durable_names(count: int) -> tuple[str, ...]:
    """The names of a run's `count` replicated durables: `DURABLE` first."""
    return (DURABLE, *(f"{DURABLE}-{i}" for i in range(1, count)))


@dataclass(frozen=True, slots=True)
class ShellParams:
    regions: int = 2
    interval_ms: int = 200
    max_delay_ms: int = 5
    link_delay_ms: int = 30
    produce_gap_ms: int = 50
    consume_gap_ms: int = 40
    consume_batch: int = 5
    failover_ms: int = 6_000
    run_ms: int = 14_000
    calm_ms: int = 5_000
    """The end of the run without chaos (the producers stop `calm_ms - 1_000` before it,
    later in a healed end)."""
    lease_ttl_ms: int = 3_000
    replicas: int = 1
    """Sidecar replicas per region, sharing the streams' leadership (`ShardLeases`)."""
    crashes: bool = False
    """Sidecars crash and restart (rebuilt from their read stream, a new lease holder)
    before the failover."""
    partitions: bool = False
    """Regions that are no durable's home are cut from the others for a while, then
    healed (none when every region is one's home)."""
    garbage: bool = False
    """Junk is published on the marker subjects: every sidecar reads it, rejects it (counted
    and logged) and goes on."""
    action_failures: float = 0.0
    """Of the requests that read, move or create a consumer: fail (an error, no reply, or
    done with the reply lost) while the home region is up."""
    timeout_ms: int = 30_000
    """A snapshot attempt's timeout (`MachineConfig.timeout_ms`)."""
    freezes: bool = False
    """Sidecar processes freeze (a GC pause, a stalled VM) for half a lease to two, then wake
    with their state: longer than the lease, another replica takes the stream over and the
    frozen one wakes a zombie, its requests under way landing late."""
    resets: bool = False
    """Users reset the durable backwards in its home (a replay, from anywhere between the
    stream's first message and its ack floor)."""
    deletions: bool = False
    """Users delete the durable in a region: elsewhere a sidecar creates it again at the next
    update; in its home the user creates it again (delivering all) unless one did first."""
    tail_lag_ms: int = 0
    """The sidecars' live reads of their read streams (the marker and origin tails) each take
    up to this much longer to see what arrived (a slow ordered consumer), on their own: the
    data tail and the positions reads may run ahead of the marker tail."""
    outage_ms: int = 0
    """From `outage_at_ms`, the last region cut off with its sidecars stopped for this long
    (its own clients still write), the others calm (no other chaos, no failing request from
    then on): with three
    regions no snapshot completes meanwhile, only progress vectors move the copies. Needs
    three regions and no failover (0: none)."""
    outage_at_ms: int = OUTAGE_AT_MS
    """When the outage begins; 0: at the deployment, as the streams are created (a first
    deployment with a region down: the others' read streams never heard from it, nor its
    from them, and its sidecars start only when it comes back)."""
    write_max_age_ms: int = 0
    """Write streams remove messages this old, sourced everywhere or not (0: no limit)."""
    read_max_age_ms: int = 0
    """Read streams remove messages this old, consumed or not (0: no limit)."""
    write_max_msgs: int = 0
    """Write streams keep at most this many messages, markers counted (0: no limit)."""
    read_max_msgs: int = 0
    """Read streams keep at most this many messages, markers counted (0: no limit)."""
    purges: bool = False
    """Operators purge a read or write stream (all of it, or all but its last messages)."""
    twins: float = 0.0
    """Of the messages a producer publishes: the fraction it publishes again in another
    region with the same `Nats-Msg-Id` (a twin; read streams store the first copy to arrive
    within their de-duplication window)."""
    moves: bool = False
    """The durable's application moves to another live region at a drawn time and back
    later, every region up (`moves`). Needs no failover and no outage."""
    healed: bool = False
    """The calm end of the run is healed: no failing request, every link up, every sidecar
    of a live region running; then every live region holding the durable completes a
    snapshot and every copy of it away from its home advances or is created (liveness)."""

    failback_ms: int = 0
    """When the home region lost at `failover_ms` comes back (0: never; docs/protocol.md §7):
    its servers with the durable where it stood, its streams under new leaders, its sidecars
    started again, its application consuming at once; sourcing between it and each region
    (its own streams' included) resumes only `reconnect_ms` (and up to 2 s more) later.
    Needs a failover."""
    reconnect_ms: int = 5_000
    both_consume: bool = False
    """After the return, the application goes on in the region it failed over to too: two
    regions consume at once (docs/protocol.md §8)."""
    quiet_return: bool = False
    """The returned region's producers start again only once every source there reconnected
    (its application still reconnects at once): no new message of its own lies before the
    others' backlog, which the guard alone keeps it from consuming again."""
    silent: bool = False
    """With three regions, the third is cut off from the return on: it never answers, the
    hold ends at its deadline (`hold_ms`)."""
    hold_ms: int = 120_000
    """The failback guard's deadline (`MachineConfig.hold_ms`)."""
    stall: bool = False
    """With a return (not `silent`): as sourcing with every other region resumes (and up to
    half a `failback_window_ms` later), the returned region's leading replica stalls for 1.2
    to 2 leases (`Sidecar.freeze`: a GC pause, a loaded machine), its lease lost while the
    guard's hold stands; another replica, or itself once awake, leads after it."""
    slow: float = 0.0
    """Of the application's fetches: the fraction where one worker is slow with one of the
    messages (it signals `+WPI`, work in progress) while the others are acked, and finishes
    it (consumed, acked) 100 ms to 2 s later, if its region is still the durable's home: the
    durable's floor stays below it meanwhile, the acks above it go out as ranges
    (docs/protocol.md §6). Not with a return (its checks follow fetches, not late acks)."""
    durables: int = 1
    """Replicated durables of the stream, each with its own home (the i-th in region
    i modulo the regions), application and ledger of what it consumed (`durables`)."""

    @property
    def failback_window_ms(self) -> int:
        """How long a returned region's durable may stay held once sourcing between it and
        every other region resumed (failback liveness): the catch-up request crosses a link,
        the other region's leader reads it and its positions (a tail, an interval), publishes
        its update and answer, they cross back, the returned region reads them and its
        positions (a tail, an interval), moves the durable and reads again (an interval
        each) and releases it (requests delayed), and slack. Of the requests, eight delays
        (`max_delay_ms`, each way of a request) are the four positions reads on that path
        asking the read stream's first sequence after their positions, one `STREAM.INFO`
        more each than before seed 874624534575's fix (`LocalSubscriptions.read`): seed 4
        with seed 9746887200's parameters, a last release 287 ms past the window as it
        was (requests delayed up to 40 ms), passes with them."""
        return (
            5 * self.interval_ms
            + 2 * self.link_delay_ms
            + 2 * self.tail_lag_ms
            + (40 + 8) * self.max_delay_ms
            + 1_000
        )

    @property
    def release_window_ms(self) -> int:
        """`failback_window_ms`, and the moves the release read asks first (`moves_ms`:
        docs/protocol.md §7; `make soak` seed 566985388639), and where write streams have limits ten intervals more: a catch-up
        request written while sourcing was down may expire from the write stream before any
        link carries it, and is asked again ten intervals later (`make soak` seed
        820359220701). Only the check uses it: the run's length stays as drawn."""
        limited = self.write_max_age_ms or self.write_max_msgs
        return self.failback_window_ms + self.moves_ms + (10 * self.interval_ms if limited else 0)

    @property
    def moves_ms(self) -> int:
        """How long the moves one positions read asks for may take: one per durable, about
        eight delayed requests each (`consumers.move_forward`). A leader carries out a job's
        outputs before its next job, so a marker read meanwhile waits that long."""
        return 8 * self.durables * self.max_delay_ms

    @property
    def snapshot_rounds_ms(self) -> int:
        """How long a snapshot may take (two rounds, one with two regions): per round the
        request crosses to the others and their answers cross back, each hop a
        publish (a delayed request), a link, a lagging marker tail and the moves the
        reading leader carries out first (`moves_ms`), and an interval for the attempt to
        start. The healed end checks that every region completes one only when the timeout
        leaves this much (`make soak` seed 846308147041: 150 ms links, requests delayed up
        to 40 ms, three durables moved at every read and a 1,500 ms timeout; with a 4 s one
        the same run's attempts took 1.5 to 3 s)."""
        hop = self.max_delay_ms + self.link_delay_ms + self.tail_lag_ms + self.moves_ms
        rounds = 1 if self.regions == 2 else 2
        return rounds * 2 * hop + self.interval_ms

    @property
    def produce_until_ms(self) -> int:
        if self.healed:  # on into the healed end, for its liveness to be seen
            return max(self.run_ms - self.vector_window_ms - self.lease_ttl_ms, self.heal_at_ms)
        return self.run_ms - self.calm_ms + 1_000

    @property
    def vector_window_ms(self) -> int:
        """How long a copy may stay behind its home's progress during an outage (vector
        liveness): the home reads its position and publishes its vector (an interval each),
        the vector crosses a link, the copy's sidecar reads its position and moves it (an
        interval each, requests delayed), and slack."""
        return 6 * self.interval_ms + 2 * self.link_delay_ms + 20 * self.max_delay_ms + 1_000

    @property
    def heal_at_ms(self) -> int:
        """When a healed end begins (`healed`): with the calm end, after a failover, and a
        second after an outage ends (its region's sidecars started again meanwhile)."""
        outage_end = self.outage_at_ms + self.outage_ms + 1_000 if self.outage_ms else 0
        return max(self.run_ms - self.calm_ms, self.failover_ms, outage_end)

    def __post_init__(self) -> None:
        if self.outage_ms and (self.regions != 3 or self.failover_ms):
            raise ValueError(
                f"an outage needs 3 regions and no failover, got {self.regions} regions, "
                f"failover_ms={self.failover_ms}"
            )
        if self.moves and (self.failover_ms or self.outage_ms):
            raise ValueError("moves of the application need no failover and no outage")
        if self.outage_ms and self.outage_at_ms + self.outage_ms > self.produce_until_ms:
            raise ValueError(f"an outage of {self.outage_ms} ms ends after the producers stop")
        if self.failback_ms and not 0 < self.failover_ms < self.failback_ms < self.run_ms:
            raise ValueError(
                f"a return at {self.failback_ms} ms needs a failover before it "
                f"(failover_ms={self.failover_ms}) and to fall in the run ({self.run_ms} ms)"
            )
        if self.silent and (self.regions != 3 or not self.failback_ms):
            raise ValueError("a silent region needs 3 regions and a return")
        if self.stall and (self.silent or not self.failback_ms):
            raise ValueError("a stall of the returned region's leader needs a return, not silent")
        if self.slow and self.failback_ms:
            raise ValueError("slow workers need no return")
        if self.hold_ms == MOVE_PAUSE_MS:
            raise ValueError(f"hold_ms must differ from a move's pause ({MOVE_PAUSE_MS} ms)")
        if self.durables < 1:
            raise ValueError(f"a run needs a durable, got durables={self.durables}")

    @classmethod
    def drawn(cls, seed: int, *, stalls: bool = True) -> ShellParams:
        """The parameters `run_shell` draws for `seed` (`stalls=False`: as drawn before runs
        with a stall were, for seeds pinned before)."""
        rng = random.Random(seed ^ 0x5E11)
        return cls.draw(rng).with_failback(rng, stalls=stalls)

    @classmethod
    def draw(cls, rng: random.Random) -> ShellParams:
        drawn = cls(
            regions=rng.randint(2, 3),
            interval_ms=rng.choice([100, 200, 500]),
            max_delay_ms=rng.choice([0, 2, 10, 40]),
            link_delay_ms=rng.choice([5, 30, 150]),
            produce_gap_ms=rng.choice([20, 50, 120]),
            consume_gap_ms=rng.choice([10, 40, 100]),
            consume_batch=rng.choice([1, 5, 20]),
            failover_ms=rng.choice([0, 3_000, 6_000]),
            action_failures=rng.choice([0.0, 0.0, 0.1, 0.3]),
            crashes=rng.random() < 0.5,
            partitions=rng.random() < 0.5,
            garbage=rng.random() < 0.3,
            replicas=rng.choice([1, 1, 2, 3]),
            timeout_ms=rng.choice([1_500, 5_000, 30_000]),
            freezes=rng.random() < 0.4,
            resets=rng.random() < 0.3,
            deletions=rng.random() < 0.25,
            tail_lag_ms=rng.choice([0, 0, 0, 100, 300]),
        ).with_outage(rng)
        # Last, from a generator of its own seeded by where `rng` stands (not drawing from
        # it): what `rng` draws next (`with_failback`) stays as it was for every seed.
        return drawn.with_edges(rng).with_durables(random.Random(f"durables {rng.getstate()}"))

    def with_outage(self, rng: random.Random) -> ShellParams:
        """A quarter of the runs that can have one (three regions, no failover) get an
        outage of 2 to 5 s."""
        if self.regions != 3 or self.failover_ms or rng.random() >= 0.25:
            return self
        return dataclasses.replace(self, outage_ms=rng.randint(2_000, 5_000))

    def with_failback(
        self, rng: random.Random, chance: float = 1 / 3, *, stalls: bool = True
    ) -> ShellParams:
        """`chance` of the runs with a failover (a third) get the lost region back 1.5 to 3 s later
        (without users' resets and deletions), the run long enough for sourcing to resume and
        the hold to end (`run_shell` draws it after `draw`, so the kinds of runs built on
        `draw` stay as they were); with `stalls`, a third of those not `silent` with a stall
        (`with_stall`)."""
        if not self.failover_ms or rng.random() >= chance:
            return self
        back = self.failover_ms + rng.randint(1_500, 3_000)
        reconnect = self.lease_ttl_ms + rng.randint(1_500, 3_000)
        silent = self.regions == 3 and rng.random() < 0.25
        # From a generator of its own seeded by where `rng` stands: the runs drawn before it
        # stay as they were.
        stall = stalls and random.Random(f"stall {rng.getstate()}").random() < 1 / 3
        returned = dataclasses.replace(
            self,
            failback_ms=back,
            reconnect_ms=reconnect,
            run_ms=back + reconnect + 2_000 + self.failback_window_ms + self.calm_ms,
            both_consume=rng.random() < 0.5,
            quiet_return=rng.random() < 0.5,
            silent=silent,
            hold_ms=self.silent_hold_ms(reconnect) if silent else 120_000,
            resets=False,
            deletions=False,
        )
        return returned.with_stall() if stall and not silent else returned

    def with_stall(self) -> ShellParams:
        """`stall`, the run longer by where it may fall (up to half a window after sourcing
        resumed), its length (two leases at most), a lease for the next leader to take over
        and a window for it to release."""
        stalled_ms = self.failback_window_ms // 2 + 3 * self.lease_ttl_ms + self.failback_window_ms
        return dataclasses.replace(self, stall=True, run_ms=self.run_ms + stalled_ms)

    def silent_hold_ms(self, reconnect_ms: int) -> int:
        """A deadline for runs with a silent region: past the last link's reconnection and
        the window after it (the answers of the others applied first), never a move's pause."""
        hold_ms = reconnect_ms + 2_000 + self.failback_window_ms + 2_000
        return hold_ms + 1 if hold_ms == MOVE_PAUSE_MS else hold_ms

    def with_edges(self, rng: random.Random) -> ShellParams:
        """What real servers, operators and producers do besides (`limits`, twins), each in
        some runs: limits by age on write and read streams in a fifth each, by count in a
        tenth each (sized above what a region writes in a second, or markers would go before
        the sidecars read them), purges in a sixth, twins in a quarter; a healed end in
        half, long enough for the liveness it checks; the application moving away and back
        in two fifths of those without a failover or an outage."""
        burst = 1_000 // self.produce_gap_ms + 10
        drawn = self.with_healed_end() if rng.random() < 0.5 else self
        return dataclasses.replace(
            drawn,
            write_max_age_ms=rng.randint(1_000, 3_000) if rng.random() < 0.2 else 0,
            read_max_age_ms=rng.randint(1_500, 4_000) if rng.random() < 0.2 else 0,
            write_max_msgs=burst + rng.randint(10, 300) if rng.random() < 0.1 else 0,
            read_max_msgs=self.regions * burst + rng.randint(40, 400) if rng.random() < 0.1 else 0,
            purges=rng.random() < 0.16,
            twins=rng.uniform(0.05, 0.3) if rng.random() < 0.25 else 0.0,
            moves=not (self.failover_ms or self.outage_ms) and rng.random() < 0.4,
        )

    def with_durables(self, rng: random.Random) -> ShellParams:
        """Two or three replicated durables in two fifths of the runs, one otherwise."""
        if rng.random() >= 0.4:
            return self
        return dataclasses.replace(self, durables=rng.randint(2, 3))

    def with_healed_end(self) -> ShellParams:
        """A healed end (`healed`), the calm end made long enough for the liveness it checks
        (`healing`): two windows and two leases, and a second."""
        calm = max(self.calm_ms, 2 * (self.vector_window_ms + self.lease_ttl_ms) + 1_000)
        return dataclasses.replace(
            self, healed=True, run_ms=self.run_ms + calm - self.calm_ms, calm_ms=calm
        )
