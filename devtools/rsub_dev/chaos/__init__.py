"""A randomized fault campaign on a real local super-cluster (issue 12): one run per seed.

`plan.draw(seed)` draws everything a run does (regions, rates, durables, failovers, the
nemesis schedule) from `random.Random(seed)`; `run.run_seed` carries it out against three
servers per region, R3 streams and one `rsub run` sidecar process per region while
recording a `history.History` through public contracts only (streams, consumers, the gRPC
API); `checker.check` decides the run from that history alone. `python -m rsub_dev.chaos`
runs a campaign. A test harness: product packages never import it.
"""
