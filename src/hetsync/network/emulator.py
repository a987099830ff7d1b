"""A worker's communication, delayed in a real run to what the network cost model says.

The protocols still move their buffers for real (loopback, shared memory); the emulator only
adds time, so that the run behaves as on the links of `--network` and with messages the size
of `--payload`. Three ways to charge, by who waits for the bytes:

- `after_blocking(step, messages, key, real_s)`: a collective the worker took part in (an
  all-reduce, a P-Reduce). Its members leave the real operation together, once the last one
  arrived, so each sleeps the modelled time minus the real transfer time. That real time is
  estimated as the shortest this operation (`key`) has taken so far: the waits for late
  members are in the rest.
- `hold_until(step, ready_at)`: an operation posted earlier and overlapped with compute
  (D-PSGD's exchange, AD-PSGD's request): its result is not used before the time it was
  posted plus its modelled time, `posted + duration(messages)`, on the machine's clock
  (`time.time()`, the same in every worker), so that a message a late peer posted is charged
  from when that peer posted it (it carries the time).
- `occupy(messages)`: a thread that serves requests one at a time (the parameter server,
  an AD-PSGD passive worker) sleeps the time of each transfer it takes part in, so that
  requests arriving together queue at its NIC as they would at the real one.
- `deliver(message, copies)` then `hold_until`: a receiver (Hop's) books each message as it
  comes on its NIC's clock, kept for the run, and holds it until its modelled arrival, so
  that messages that overlap in time share its ingress.

Each operation is charged on idle NICs (`NetworkModel.duration`): contention between separate
operations shows only where a serving thread queues them, which is where the papers place it
(the parameter server's hot link, AD-PSGD's busy partners). Messages that carry the model are
scaled by `--payload` / the model's real size; control messages (tokens, Group Generator
requests) are charged their real size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hetsync.network.model import LinkChange, Message, NetworkModel
from hetsync.network.spec import NetworkSpec, parse_network, parse_payload
from hetsync.transport.flat import model_tensors

if TYPE_CHECKING:
    from torch import nn

    from hetsync.step import Step
    from hetsync.transport.runtime import Runtime

__all__ = ["FreeNetwork", "Network", "NetworkEmulator", "model_bytes"]


def model_bytes(model: nn.Module) -> int:
    """What the model's shared state weighs: the tensors the protocols send."""
    return sum(t.numel() * t.element_size() for t in model_tensors(model))


class FreeNetwork:
    """No emulated network (`--network none`): every charge is nothing, and messages carry
    no send time; what a driver's channel (hetsync.transport.channel) asks of a network."""

    scale = 1.0
    emulated = False
    """Whether messages are charged (an emulator) or travel as they are (a free network)."""
    background_wait: Callable[[float], float] = staticmethod(lambda seconds: seconds)

    def scaled(self, nbytes: float) -> float:
        return nbytes

    def stamp(self, runtime: Runtime) -> float:
        return 0.0

    def origin(self, runtime: Runtime) -> float:
        return 0.0

    def duration(self, messages: Sequence[Message]) -> float:
        return 0.0

    def after_blocking(self, step: Step | None, messages: Sequence[Message], key: str,
                       real_s: float) -> None:
        """Nothing to add: the real transfer's time is the wait."""

    def hold_until(self, step: Step | None, ready_at: float, modelled: float = 0.0) -> None:
        """Nothing to hold: a message is usable when it is in."""

    def deliver(self, message: Message, copies: int, sent: float) -> float:
        return sent

    def occupy(self, messages: Sequence[Message]) -> float:
        return 0.0

    def take_background(self) -> float:
        return 0.0


class NetworkEmulator(FreeNetwork):
    """Charges one worker's communication by the cost model; see the module doc."""

    emulated = True

    def __init__(
        self, spec: NetworkSpec, world: int, clock: Callable[[], float], scale: float = 1.0,
        changes: Sequence[LinkChange] = (), run_time: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.model = NetworkModel(spec, world, changes, run_time)
        self.clock = clock
        """Seconds on a clock every worker of the machine shares and that never jumps (not
        `Runtime.elapsed`, whose origin is set when the workers are ready: a receiver thread
        may book a message before that)."""
        self.scale = scale
        self._floor: dict[str, float] = {}
        self._background_s = 0.0  # charged by serving and receiving threads
        self._lock = threading.Lock()  # the background figure and the NIC clocks
        self.background_wait: Callable[[float], float] = lambda seconds: seconds
        """Given a wait a protocol thread is about to sleep, the seconds to sleep: the run's
        --max-time cuts it and a long one is announced to the launcher, as the training
        thread's are (`Step.on_wait`); set by the training loop."""

    @classmethod
    def for_run(cls, network: str, payload: str, world: int, model: nn.Module,
                changes: Sequence[LinkChange] = (),
                run_time: Callable[[], float] = lambda: 0.0) -> Network:
        """The emulator that a run's `--network` and `--payload` ask for, among `world`
        workers (`FreeNetwork` on a free one); `changes` (`--fault slow-link`) apply from
        their time on `run_time`."""
        spec = parse_network(network)
        if spec is None:
            return FreeNetwork()
        declared = parse_payload(payload)
        scale = declared / max(model_bytes(model), 1) if declared is not None else 1.0
        return cls(spec, world, time.time, scale, changes, run_time)

    def scaled(self, nbytes: float) -> float:
        """The declared size of a message that carries `nbytes` of the real model."""
        return nbytes * self.scale

    def stamp(self, runtime: Runtime) -> float:
        """A message's send time for its header: on the run's clock."""
        return runtime.elapsed()

    def origin(self, runtime: Runtime) -> float:
        """Where the run's clock starts on the machine's (a header's time is from there)."""
        return runtime.t0

    def duration(self, messages: Sequence[Message]) -> float:
        return self.model.duration(messages)

    def after_blocking(
        self, step: Step | None, messages: Sequence[Message], key: str, real_s: float
    ) -> None:
        floor = min(self._floor.get(key, real_s), real_s)
        self._floor[key] = floor
        modelled = self.duration(messages)
        self._wait(step, modelled - floor, modelled)

    def hold_until(self, step: Step | None, ready_at: float, modelled: float = 0.0) -> None:
        """Sleep until `ready_at` on `clock`; `modelled` is the transfer time charged."""
        self._wait(step, ready_at - self.clock(), modelled)

    def _wait(self, step: Step | None, seconds: float, modelled: float) -> None:
        """On the training thread, the wait is time blocked in synchronisation and the
        transfer's modelled time is the iteration's `network_s` (overlapped or not)."""
        if step is None:
            time.sleep(max(0.0, self.background_wait(seconds)))
            self._add_background(modelled)
            return
        with step.blocking():
            if step.on_wait is not None:
                seconds = step.on_wait(seconds)
            time.sleep(max(0.0, seconds))
        step.network_s += modelled

    def deliver(self, message: Message, copies: int, sent: float) -> float:
        """Book `message`, sent at `sent` (on `clock`), on this worker's own NIC clock (which
        carries over, so messages that overlap in time share its ingress); its arrival."""
        with self._lock:  # several receiving threads book on this worker's NIC
            return self.model.deliver(message, sent, copies)

    def occupy(self, messages: Sequence[Message]) -> float:
        """Sleep the messages' modelled time (in a serving thread); returns it."""
        modelled = self.duration(messages)
        time.sleep(max(0.0, self.background_wait(modelled)))
        self._add_background(modelled)
        return modelled

    def take_background(self) -> float:
        """Network time charged off the training thread since the last call (for the row of
        the iteration that ends now)."""
        with self._lock:
            taken, self._background_s = self._background_s, 0.0
        return taken

    def _add_background(self, seconds: float) -> None:
        with self._lock:
            self._background_s += seconds


Network = FreeNetwork
"""What a channel charges: the emulator, or the free network's nothing."""
