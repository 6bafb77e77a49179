"""The sidecar runtime: NATS and timers in, the PIP-33 machines in the middle, actions out.

Programmatic use (tests, the demo, `rsub run`)::

    runtime = Runtime(config)          # a sidecar.config.Config; nothing happens yet
    await runtime.start()              # connect etc. in the background
    await runtime.wait_ready(30)       # connected, topology applied, every stream rebuilt
                                       # (with discovery: those of its first round too)
                                       # (raises NatsRefused if NATS refused the credentials)
    runtime.leadership("orders")       # LeaseState: leads it?, epoch, holder (the leader)
    runtime.is_leader, runtime.readiness   # is_leader: it leads at least one stream
    await runtime.wait_failed()        # returns the NatsRefused that stopped the bring-up
    await runtime.stop()               # release its shards, flush and close

`Runtime(config, holder=..., apply_topology=False)`: `holder` names this replica in the
leases (default host-pid-random); `apply_topology=False` skips `apply_topology` at start (the
streams must exist). `runtime.backend` (a `RuntimeBackend`) implements
`sidecar.api.backend.SidecarBackend` (answering with `views`, raising `errors`); the runtime
answers the calls programs make of it (`await runtime.status()`, `get_subscription`, ...)
by handing them to its backend. It drives `SidecarMetrics` (`sidecar.metrics`) and serves
nothing: `sidecar.api.service.Service`, a `Runtime` that serves gRPC and HTTP over its
backend, is what `rsub run` runs.

One module per role:

- `root`: `Runtime`, the composition root: builds the handles, the drivers and the
  backend over them (which it holds, and tells how far the bring-up got), brings up
  (connect, topology, the region's KV bucket, shard leases), starts and stops one stream at
  a time, retries with back-off, turns each shard lease's changes into leadership inputs of
  the shard's streams, stops;
- `discovery`: `StreamDiscovery`, with `discovery.enabled`: lists the account's streams
  every `discovery.interval_s`, has the root start the virtual streams that match and stop
  those whose read stream is gone;
- `driver`: `StreamDriver`, one per virtual stream `V`: rebuilds `V`'s machine from the
  origins of the data and the markers stored in its read stream (DESIGN §5, §7), and feeds
  everything to the machine one job at a time, handing each output to the effects
  (actions), the reader queue (`ReadPositions`) or the observer (events); it decides
  nothing (the machine's `needs()` says when);
- `tails`: `StreamTails`, the read stream replayed, then its markers and data origins
  followed live (origins in batches: `batches`);
- `intervals`: `IntervalLoop`, one per region: every stream's `interval` each
  `snapshot.interval_ms`, and the positions reads the machines ask for;
- `effects`: each action carried out on NATS, only while the stream's shard lease says this
  replica leads it with the machine's epoch;
- `observer`: events and markers read, as metrics and structured logs;
- `backend`: `RuntimeBackend`, the API's reads and writes (`SidecarBackend`) over the
  root's handles and drivers, answered with the views of `views` and failing with the
  errors of `errors` (the API imports both); its readiness reads the root's
  `BringUpState`;
- `positions`: `LocalSubscriptions`, `V`'s durables (one consumer listing) and external
  cursors (one KV get), as last read, at their effective positions (a floor extended over
  the markers after it: `sidecar.nats.effective`);
- `handles`: the port to JetStream (`sidecar.nats.port.JetStreamPort`, the only way the
  modules above reach NATS; `root` builds a `NatsPort`, and keeps a path of its own for its
  bring-up, as `discovery` does for its listing), the connection's state, cursor store and
  shard leases shared by the others, and the one clock the runtime reads (`clock`: the wall
  clock unless the handles are given another, as a simulation does).

Leadership is per stream: the lease of the stream's shard in the region's KV bucket
`<lease.bucket>-<region>` (keys `shards.<i>`, with the gate `leader` and `members.<holder>`,
see `sidecar.nats.shards`), so the replicas of a region share the streams; the same bucket
keeps the external cursors (key `cursors.<V>`, see `sidecar.nats.cursors`).
Followers keep their machines up to date from the tail (so reads work on every replica);
a new leader's machine gets `became_leader(epoch)` and carries out what its predecessor
missed. A lost NATS connection is reported (readiness, metrics, UNAVAILABLE for writes) and
retried; a malformed marker is counted and skipped. Only a refusal of the credentials or TLS
settings at the very first connection is final: it is logged as one error line
(`nats_refused`), `runtime.failure` holds it and `wait_failed()` / `wait_ready()` return /
raise it; the caller decides to stop (`rsub run` exits with status 3).
"""

from sidecar.runtime.root import Runtime

__all__ = ["Runtime"]
