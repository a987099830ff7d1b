"""What things cost on the virtual clock: compute, messages and the central services.

Compute is the emulated step time (`--step-time`) times the slowdown factor of that iteration
(`--slowdown`), as real runs pace it, plus a fixed per-iteration overhead for what a real
iteration does besides computing (the training loop, logging, the protocol's Python). Messages
are booked on the cost model of `hetsync.network` (`--network`), the very object emulated real
runs use; without `--network` they are booked on `LOCAL_NETWORK`, the loopback of one machine
as gloo sees it, so that a simulated free-network run is comparable with a real one.

The Group Generator and the parameter server are one thread on rank 0 in real runs: each
request takes `SERVICE_S[name]` of that thread, and requests queue (FIFO), which is where the
simulator shows them saturate at scale. They are options of `simulate` (`--gg-service-us`,
`--ps-service-us`), not constants of the protocols.

Calibration. Measured on the project machine (2 CPUs shared with other sessions, load average
3-21 while measuring), by commands that anyone can re-run:

* `LOCAL_NETWORK`: `python experiments/sim_calibration.py`: two gloo processes ping-pong
  64 B and 3140 B (an svm model), sleeping 2 ms between rounds as workers do, so each receive
  wakes a sleeping process: the median one-way latency was 0.23-0.78 ms over three runs
  (0.7 ms taken, the middle run's; the 90th percentile is 2.5-5 ms), and a 10 MB transfer ran
  at 1.8-3.0 Gbit/s (2.4 taken). On an idle machine the latency is nearer 0.1 ms: the figure
  is the scheduler's, not the socket's.
* `ITERATION_OVERHEAD_S`: `python experiments/sim_validation.py --calibrate` (or
  `sim_calibration.py --runs DIR`): in the real runs' rows, the increment of `t` minus
  `compute_s`, `injected_delay_s` and `sync_wait_s`, i.e. what an iteration spends outside
  its padded compute and its waits (the loop, the row, the heartbeat, the protocol's Python,
  late wake-ups from sleep). Mean over iterations 6 onwards of the 12 eight-worker,
  free-network real runs of hop, hop --backup 1 --skip, prague and prague --gg-policy random
  --group-buffer under the three suite slowdowns: 4.8 ms (per run 1.7-8.6 ms, larger for
  Prague and under heavier load; at 16 workers on 2 CPUs it grows further).
* `SERVICE_S["group-generator"]`: `python experiments/sim_calibration.py`: rank 1 sends
  3000 three-float messages as fast as it can to a copy of the Group Generator's two threads
  on rank 0 (any-source `recv` -> queue -> serving thread -> one `send` of an assignment per
  two messages, as a request and a finish alternate); rank 0's process CPU time per message
  was 0.33 ms, plus 7-36 µs for `GroupGeneratorCore.handle` itself (replayed on 16 workers):
  0.36 ms. CPU time, since the wall time per message (1.8-3.9 ms) measures the other
  sessions' load rather than the thread. Measured on that two-thread loop; the generator now
  serves a message on the thread that receives it, and under the `ready` policy a request
  carries the group finished before it (one message a step, not two). The script times the
  new loop; idle, it and the old one cost the same per message (0.255 and 0.253 ms of CPU,
  docs/simulator.md), so the figure is kept.
* `SERVICE_S["parameter-server"]`: from two real runs of
  `python experiments/sim_validation.py --workers 8 --protocols ps-sync,ps-async` (svm,
  8 workers, homogeneous, load 3-4): a synchronous round makes each worker wait for all
  eight pushes to be served, an asynchronous push only for its own reply. The 10th
  percentile of the synchronous waits (3.75 ms: the rounds whose pushes came together) minus
  the median asynchronous wait (1.07 ms: one push and its reply) over the eight pushes of a
  round: (3.75 - 1.07) / 8 = 0.34 ms per push, close to the Group Generator's per-message
  figure, as expected of the same kind of Python thread (receive, one core decision, a tiny
  optimizer step, send).
* `CONTROL_BYTES`: the Group Generator's request is 3 floats (12 B) and its assignment
  3 + world floats (44 B at 8 workers, 76 B at 16); a Hop token is 1 float. 64 B stands for
  all: at loopback bandwidth it costs 0.2 µs, nothing next to the latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsync.network.model import NetworkModel
from hetsync.network.spec import parse_network
from hetsync.slowdown import SlowdownSpec

__all__ = ["LOCAL_NETWORK", "SERVICE_S", "Costs", "Server"]

#: The loopback of the project machine, as the cost model's NICs: gloo's one-way latency for
#: small messages between sleeping processes, and its bulk bandwidth (see Calibration).
LOCAL_NETWORK = "bandwidth=2400Mbit,latency=700us"

#: Seconds of rank 0's serving thread per request, measured in real runs.
SERVICE_S = {"group-generator": 360e-6, "parameter-server": 340e-6}

#: Bytes of a control message (a request, a token, an assignment): a few floats.
CONTROL_BYTES = 64.0

#: Seconds a real iteration spends outside compute and synchronisation (loop, logging).
ITERATION_OVERHEAD_S = 4.8e-3


@dataclass
class Costs:
    """The cost models of one simulated run."""

    step_s: float
    slowdown: SlowdownSpec
    network: NetworkModel
    payload_bytes: float
    """What one model (or gradient) weighs on the wire: `--payload`, or the real model's."""
    overhead_s: float = ITERATION_OVERHEAD_S

    def __post_init__(self) -> None:
        nics = self.network.nics
        self._uniform = all(nic == nics[0] for nic in nics)
        self._control = self.network.transfer_time(0, 0, CONTROL_BYTES)

    @classmethod
    def build(cls, step_ms: float, slowdown: SlowdownSpec, network: str, world: int,
              payload_bytes: float) -> Costs:
        spec = parse_network(network) or parse_network(LOCAL_NETWORK)
        assert spec is not None
        return cls(step_ms / 1000.0, slowdown, NetworkModel(spec, world), payload_bytes)

    def compute(self, rank: int, iteration: int) -> tuple[float, float]:
        """(compute seconds, of which injected delay) of `iteration` of `rank`."""
        factor = self.slowdown.factor(rank, iteration)
        return self.step_s * factor + self.overhead_s, self.step_s * (factor - 1.0)

    def latency(self, src: int, dst: int) -> float:
        """When a control message sent now arrives, relative to now."""
        if self._uniform:
            return self._control
        return self.network.transfer_time(src, dst, CONTROL_BYTES)


class Server:
    """A single thread serving requests in arrival order, each taking `service_s`."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s
        self.free_at = 0.0
        self.busy_s = 0.0
        self.served = 0

    def admit(self, now: float) -> float:
        """When a request arriving at `now` has been served."""
        done = max(now, self.free_at) + self.service_s
        self.free_at = done
        self.busy_s += self.service_s
        self.served += 1
        return done
