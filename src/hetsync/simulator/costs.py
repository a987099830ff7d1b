"""What things cost on the virtual clock: compute, messages and the central services.

Compute is the emulated step time (`--step-time`) times the slowdown factor of that iteration
(`--slowdown`), as real runs pace it, plus a fixed per-iteration overhead for what a real
iteration does besides computing (the training loop, logging, the protocol's Python). Messages
are booked on the cost model of `hetsync.network` (`--network`), the very object emulated real
runs use; without `--network` they are booked on `LOCAL_NETWORK`, the loopback of one machine
as gloo sees it, so that a simulated free-network run is comparable with a real one.

The Group Generator and the parameter server are one thread on rank 0 in real runs: each
request takes `SERVICE_S[name]` of that thread, and requests queue (FIFO), which is where the
simulator shows them saturate at scale. The figures below were measured on the project
machine (docs/simulator.md says how); they are options of `simulate`, not constants of the
protocols.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsync.network.model import NetworkModel
from hetsync.network.spec import parse_network
from hetsync.slowdown import SlowdownSpec

__all__ = ["LOCAL_NETWORK", "SERVICE_S", "Costs", "Server"]

#: The loopback of the project machine, as the cost model's NICs: gloo's one-way latency for
#: small messages between sleeping processes, and its memory-copy bandwidth.
LOCAL_NETWORK = "bandwidth=8Gbit,latency=100us"

#: Seconds of rank 0's serving thread per request, measured in real runs.
SERVICE_S = {"group-generator": 60e-6, "parameter-server": 150e-6}

#: Bytes of a control message (a request, a token, an assignment): a few floats.
CONTROL_BYTES = 64.0

#: Seconds a real iteration spends outside compute and synchronisation (loop, logging).
ITERATION_OVERHEAD_S = 0.4e-3


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
        self._control = self._control_latency(0, 0)

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
        return self._control if self._uniform else self._control_latency(src, dst)

    def _control_latency(self, src: int, dst: int) -> float:
        nics = self.network.nics
        a, b = nics[src], nics[dst]
        return CONTROL_BYTES / min(a.egress, b.ingress) + max(a.latency, b.latency)


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
