"""The failback guard's hold left standing, on real servers (docs/protocol.md §7, "A hold left
standing"): west returns and its sidecar holds `billing`; that sidecar stops while holding
(as a leader that loses its lease does), and the one started after it finds the durable
paused and every source heard again. Before, that one saw no return and released nothing:
the durable stayed paused to the hold's deadline (120 s), as the guard scenario did once
under the load of a four-worker `make test`. Now it takes the hold over and releases it
once every other region answered its catch-up request.

The run of tests/scenarios/test_failback.py's guard scenario, with the restart
(`FailbackRun.restart_holding`); in a file of its own, so that it runs beside that one.
"""

from __future__ import annotations

import pytest

from rsub_dev.cluster import ClusterFactory
from rsub_dev.failback import FailbackRun, failback
from tests.support.scenario_kit import INTERVAL_MS, LEASE_TTL_S, TIMEOUT_S

pytestmark = pytest.mark.integration

REGIONS = ("west", "central", "east")
# The sidecars' default `failback.hold_s`: a hold that lapsed by itself would take this long.
HOLD_S = 120.0


@pytest.mark.timeout(240)
async def test_a_sidecar_started_while_its_predecessors_hold_stands_releases_it(
    make_cluster: ClusterFactory,
) -> None:
    run = FailbackRun(
        home="west",
        away="east",
        rate_per_s=100.0,
        warm_s=2.0,
        away_s=8.0,
        after_s=5.0,
        interval_ms=INTERVAL_MS,
        timeout_s=TIMEOUT_S,
        lease_ttl_s=LEASE_TTL_S,
        restart_holding=True,
    )
    got = await failback(await make_cluster(list(REGIONS)), run)
    heard = [s for s in got.sources_heard_s.values() if s is not None]
    print(
        f"\nheld at {got.held_s} s, sources heard {got.sources_heard_s}, first new delivery "
        f"{got.first_new_delivery_s} s, holds {got.holds}, lost {got.lost}"
    )
    assert got.held_s is not None and len(heard) == len(REGIONS) - 1
    # The restarted sidecar reports the hold it took over as caught up, none expired.
    assert got.holds["caught_up"].count == 1
    assert got.holds["expired"].count == 0
    assert got.held_durables == 0
    assert got.lost == 0
    # West delivers new data again well before the standing pause's deadline would end it.
    assert got.first_new_delivery_s is not None
    assert got.first_new_delivery_s < got.held_s + HOLD_S / 2
