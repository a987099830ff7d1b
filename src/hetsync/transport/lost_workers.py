"""A worker's view of the workers lost from its run (`--on-failure continue`).

The launcher is the failure detector: it sees exits and missing heartbeats, kills a stopped
or hung worker so that transfers with it end, and publishes the lost ranks in the control
store (hetsync.launch.monitor). A worker's protocol learns of them here, two ways:

- `subscribe(callback)`: a thread polls the store and calls back once per newly lost rank
  (a Hop worker stops waiting for its updates, the Group Generator stops grouping it, ...);
- `confirm(rank)`: a transfer with `rank` failed; wait until the launcher says whether it
  is lost (then the protocol goes on without it) or not (then the error is real);
- `wait_for(work, rank)`: wait for a transfer with `rank`, which fails once `rank` is declared
  lost. gloo fails a receive from a peer that dies, but a send that was under way may never
  return (a 80 MB send, the receiver killed mid-message: measured with torch 2.13), and
  `Work.wait(timeout)` cannot help: gloo closes the pair when it times out, and a p2p Work is
  complete only once waited. So the waits run on a thread of their own (one per peer and
  calling thread, so that no caller's wait queues behind another's), and the caller gives up
  when the launcher declares the peer lost (that thread stays blocked, harmlessly).

A peer's process can die before the launcher notices (its connections close at once), so a
failed transfer always asks; a peer that stops answering is only known from the launcher.

Callbacks run on the watcher thread only, never inside `confirm()` or `refresh()`: those are
called from a protocol's transfers, which may hold a lock that the protocol's callback takes
(the parameter server sends its replies under one, and its callback sends replies too). A
callback that raises is reported on stderr with its traceback and kept in `error`, which the
training loop raises (`raise_error()`); the watcher goes on telling the other subscribers.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable

import torch.distributed as dist

__all__ = ["LOST_KEY", "LostWorkers", "PeerLost", "Waited", "unless_lost", "wait_each"]

LOST_KEY = "lost"
POLL_S = 0.1


class PeerLost(RuntimeError):
    """A transfer was given up: the launcher declared its peer lost while it was under way."""


def unless_lost(lost: LostWorkers | None, peer: int, transfer: Callable[[], object]) -> bool:
    """Run `transfer` with `peer`. If it fails where workers may be `lost` and the launcher
    declares `peer` lost, return False (the caller goes on without it); otherwise the error
    is raised. True if the transfer succeeded."""
    try:
        transfer()
    except RuntimeError as error:
        if lost is None:
            raise
        lost.confirm(peer, error)
        return False
    return True


class LostWorkers:
    """The ranks the launcher has declared lost, polled from the control store."""

    def __init__(self, store: dist.Store, world_size: int, confirm_timeout: float) -> None:
        self._store = store
        self.world_size = world_size
        self.confirm_timeout = confirm_timeout
        """How long a failed transfer waits for the launcher's word: its detection time."""
        self.ranks: frozenset[int] = frozenset()
        self.error: BaseException | None = None
        """The first exception a subscriber's callback raised."""
        self._told: set[int] = set()  # the ranks the watcher has told its subscribers of
        self._subscribers: list[Callable[[int], None]] = []
        self._waiters: dict[tuple[int, int], queue.SimpleQueue[Waited]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def refresh(self) -> frozenset[int]:
        """Read the store now: the ranks lost so far (their subscribers are told by the
        watcher thread, not here)."""
        with self._lock:
            value = self._store.get(LOST_KEY).decode() if self._store.check([LOST_KEY]) else ""
            self.ranks |= frozenset(int(r) for r in value.split(",") if r)
            return self.ranks

    def raise_error(self) -> None:
        """Raise the error of a subscriber's callback, if one failed: the protocol missed a
        loss, so it may wait for the lost worker for good."""
        if self.error is not None:
            raise RuntimeError(f"hetsync: reacting to a lost worker failed: {self.error!r} "
                               "(traceback on stderr)") from self.error

    def subscribe(self, callback: Callable[[int], None]) -> None:
        """Call `callback(rank)` from the watcher thread, once for each rank lost from now
        on; never from another thread, so it may take the caller's locks."""
        with self._lock:
            self._subscribers.append(callback)
            start = self._thread is None
            if start:
                self._thread = threading.Thread(target=self._watch, name="hetsync-lost",
                                                daemon=True)
        if start:
            assert self._thread is not None
            self._thread.start()

    def confirm(self, rank: int, error: BaseException) -> None:
        """A transfer with `rank` failed with `error`: return once the launcher has declared
        `rank` lost (the caller goes on without it; subscribers hear of it from the watcher
        thread); raise `error` if it does not within `confirm_timeout`."""
        deadline = time.monotonic() + self.confirm_timeout
        while rank not in self.refresh():
            if time.monotonic() > deadline:
                raise error
            time.sleep(POLL_S)

    def wait_for(self, work: dist.Work, rank: int) -> None:
        """Wait for `work`, a transfer with `rank`: return once it is done, raise its error,
        or raise `PeerLost` once the launcher declares `rank` lost (as `unless_lost` expects
        of a failed transfer)."""
        waited = Waited(work)
        if rank not in self.ranks:
            self._waiter(rank).put(waited)
            while not waited.done.wait(POLL_S):  # no watcher may be reading the store
                if rank in self.refresh():
                    break
        if not waited.done.is_set():
            raise PeerLost(f"rank {rank} was declared lost during a transfer with it")
        if waited.error is not None:
            raise waited.error

    def _waiter(self, rank: int) -> queue.SimpleQueue[Waited]:
        """The queue of the thread that waits for the calling thread's transfers with `rank`,
        started on first use."""
        key = (rank, threading.get_ident())
        with self._lock:
            if key not in self._waiters:
                self._waiters[key] = queue.SimpleQueue()
                threading.Thread(target=wait_each, args=(self._waiters[key],),
                                 name=f"hetsync-wait-{rank}", daemon=True).start()
            return self._waiters[key]

    def close(self) -> None:
        """Stop watching, before the store goes: a watcher still reading it while the
        interpreter exits aborts the process ("terminate called without an active
        exception")."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_S + 5)  # a store read in flight ends soon

    def _watch(self) -> None:
        while not self._closed.wait(POLL_S):
            try:
                lost = self.refresh()
            except Exception:  # noqa: BLE001 - the store is gone: the run is ending
                return
            with self._lock:
                subscribers = list(self._subscribers)
            for rank in sorted(lost - self._told):
                self._told.add(rank)
                for callback in subscribers:
                    self._call(callback, rank)

    def _call(self, callback: Callable[[int], None], rank: int) -> None:
        """Tell `callback` of `rank`; a failure is reported, and does not stop the watcher."""
        try:
            callback(rank)
        except Exception as error:  # noqa: BLE001 - reported here, raised by raise_error()
            print(f"hetsync: a callback for lost rank {rank} ({callback!r}) failed:\n"
                  + "".join(traceback.format_exception(error)), file=sys.stderr, flush=True)
            if self.error is None:
                self.error = error


class Waited:
    """A transfer handed to a waiting thread, and how its wait ended (also the waits of a
    generation's collectives: hetsync.transport.membership)."""

    def __init__(self, work: dist.Work) -> None:
        self.work = work
        self.done = threading.Event()
        self.error: RuntimeError | None = None


def wait_each(waits: queue.SimpleQueue[Waited]) -> None:
    """A waiting thread: its transfers' waits, in the order they were handed over."""
    while True:
        waited = waits.get()
        try:
            waited.work.wait()
        except RuntimeError as error:
            waited.error = error
        waited.done.set()
