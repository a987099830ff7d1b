"""A worker's side of the control store, off its training thread: its heartbeat out to the
launcher, the run's stop in.

The launcher's monitor reads each worker's heartbeat (`hb/<rank>`: iteration, phase, run
time) to tell a worker that computes from one that waits and from one that hangs, and a worker
stops once the run's stop key is set (the launcher's evaluation reached the target, or the
launcher stops the run). Sent and polled by the training thread, these were a store message at
every phase change (a wait's `sync`, then `compute`: three or more an iteration) and a round
trip to the store every 0.25 s: 0.5-1 % of the training thread in sampling profiles, each
message a wait for the socket and for the GIL back, and with 8 workers hundreds of messages a
second to a launcher that may share a core with a worker.

Here the training thread only records its latest beat (one assignment), and a thread of its
own sends it when it has changed, at most every `every` seconds, and polls the stop key in
the same pass. What the monitor relies on holds: the thread sends what the worker recorded
and never freshens it, so a worker that makes no progress sends nothing new and is seen to
stall; a phase recorded is sent within `every` (a wait of 20 s says `sync` after a quarter of
a second at most). `flush()` sends the latest beat from the caller at once: the last ones
(`closing`, `done`) must be in the store before the worker goes on.
"""

from __future__ import annotations

import threading

import torch.distributed as dist

__all__ = ["STOP_KEY", "ControlChannel"]

#: Key in the control store that, once set, asks every worker to stop (value: the reason).
STOP_KEY = "stop"


class ControlChannel:
    """Heartbeats to `hb/<rank>` (with `beats`: a launched run's monitor reads them) and the
    value of `STOP_KEY` once set, through `store`, on a thread named `hetsync-control`."""

    def __init__(self, store: dist.Store, rank: int, *, beats: bool, every: float = 0.25
                 ) -> None:
        self._store: dist.Store | None = store
        self._key = f"hb/{rank}" if beats else None
        self._every = every
        self._latest: str | None = None  # the beat recorded last (one assignment: atomic)
        self._sent: str | None = None
        self._stop: str | None = None
        self._sending = threading.Lock()  # a flush and the thread send one beat at a time
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hetsync-control", daemon=True)
        self._thread.start()

    def beat(self, text: str) -> None:
        """Record this worker's latest heartbeat; the thread sends it."""
        self._latest = text

    def flush(self) -> None:
        """Send the latest heartbeat now, from the calling thread."""
        self._send()

    def stop_reason(self) -> str | None:
        """The stop key's value once the thread has seen it set, else None."""
        return self._stop

    def close(self) -> None:
        """Send the latest heartbeat, stop the thread and let go of the store (idempotent):
        before the store goes, and with the iteration a failing worker got to."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=self._every + 5)  # a store call in flight ends soon
        try:
            self._send()
        finally:
            self._store = None  # a TCPStore client freed at exit may abort the process

    def _send(self) -> None:
        with self._sending:
            latest, store = self._latest, self._store
            if self._key is not None and store is not None and latest not in (None, self._sent):
                store.set(self._key, latest)
                self._sent = latest

    def _run(self) -> None:
        while not self._closed.wait(self._every):
            try:
                self._send()
                store = self._store
                if self._stop is None and store is not None and store.check([STOP_KEY]):
                    self._stop = store.get(STOP_KEY).decode()
            except Exception:  # noqa: BLE001 - the store is gone: the run is ending
                return
