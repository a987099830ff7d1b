"""Workers' stdout and stderr, shown line by line above the launcher's progress bar.

Each worker writes into two pipes. One thread reads them all (a selector: one thread for any
number of workers) and hands each complete line, prefixed with its rank, to `tqdm.write`,
which lifts the bar, prints the line and redraws the bar below it, so a worker's `print`
never lands on the bar's line. The pipes are read whatever happens to the launcher's own
output, so a chatty worker never blocks on a full pipe. A copy of each worker's output, both
streams as they came and without the prefix, goes to `logs/rank{r}.out`. The tracebacks of
the failure report come from `logs/rank{r}.log`, which the worker writes itself.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO

from tqdm import tqdm

__all__ = ["OutputRelay"]

#: Longer lines are shown in pieces (a worker redrawing its own bar with "\r", say).
MAX_LINE = 1 << 16
#: Lines of each stream kept for a failure report (the monitor shows as many).
TAIL_LINES = 30


class _Stream:
    """One worker's stdout or stderr: where its lines go and the line not finished yet."""

    def __init__(self, rank: int, to_stderr: bool, copy: IO[bytes]) -> None:
        self.rank, self.to_stderr, self.copy = rank, to_stderr, copy
        self.muted = False
        self.partial = b""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        """The last lines, for a failure report (the copy interleaves both streams in the
        order the relay happened to read them, which is not the order they were written)."""

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self._show(line)
        self.copy.flush()  # the monitor reads it when the worker fails

    def finish(self) -> None:
        if self.partial:
            self._show(self.partial)
            self.partial = b""
        self.copy.flush()

    def _show(self, line: bytes) -> None:
        self.copy.write(line + b"\n")
        text = line.decode(errors="replace")
        self.tail.append(text)
        if self.muted:
            return
        shown = text.rstrip("\r").rsplit("\r", 1)[-1]  # as a tty would
        try:
            tqdm.write(f"[rank {self.rank}] {shown}",
                       file=sys.stderr if self.to_stderr else sys.stdout)
        except (OSError, ValueError):
            pass  # the launcher's terminal is gone (`| head`): keep draining the pipes


class OutputRelay:
    """Relays the workers' pipes (spawned with stdout and stderr=PIPE) until they close."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], log_dir: Path) -> None:
        self._selector = selectors.DefaultSelector()
        self._open = [2] * len(procs)  # pipes not at end of file, per rank
        self._closed = threading.Condition()
        self._copies = [open(log_dir / f"rank{r}.out", "wb") for r in range(len(procs))]
        self._streams: list[_Stream] = []
        for rank, proc in enumerate(procs):
            for pipe, to_stderr in ((proc.stdout, False), (proc.stderr, True)):
                if pipe is None:
                    raise ValueError(f"worker rank {rank} was not spawned with pipes")
                stream = _Stream(rank, to_stderr, self._copies[rank])
                self._streams.append(stream)
                self._selector.register(pipe, selectors.EVENT_READ, stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hetsync-output", daemon=True)
        self._thread.start()

    def add(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        """Relay `proc`, worker `rank` restarted, into the same logs/rank{r}.out."""
        with self._closed:
            self._open[rank] += 2
        for pipe, to_stderr in ((proc.stdout, False), (proc.stderr, True)):
            assert pipe is not None, f"worker rank {rank} was not spawned with pipes"
            stream = _Stream(rank, to_stderr, self._copies[rank])
            self._streams.append(stream)
            self._selector.register(pipe, selectors.EVENT_READ, stream)

    def close(self, timeout: float = 2.0) -> None:
        """Show the last lines of workers that have exited; give up on pipes still open after
        `timeout` seconds (a child of a worker may hold them)."""
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join()

    def mute(self, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """From now on, copy the output of every rank but `keep` to logs/rank{r}.out only:
        once a run has failed, the peers' follow-on errors (connection closed by a dead peer)
        would bury the one line that names the failure; the failed ranks' own lines stay."""
        for stream in self._streams:
            stream.muted = stream.rank not in keep

    def wait_for(self, rank: int, timeout: float = 10.0) -> None:
        """Wait until rank's pipes are drained (it exited), so logs/rank{r}.out is complete
        (at most `timeout`: the relay thread can lag on a loaded machine)."""
        with self._closed:
            self._closed.wait_for(lambda: self._open[rank] == 0, timeout)

    def tail(self, rank: int, stderr: bool) -> list[str]:
        """The last lines `rank` wrote to stderr (or stdout), as far as the relay read them."""
        return next(list(s.tail) for s in self._streams
                    if s.rank == rank and s.to_stderr == stderr)

    def _loop(self) -> None:
        try:
            while self._selector.get_map() and not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.2):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        key.data.feed(chunk)
                    else:  # end of file: the worker (and its children) closed it
                        self._drop(key)
        finally:
            for key in list(self._selector.get_map().values()):
                self._drop(key)
            self._selector.close()
            for copy in self._copies:
                copy.close()

    def _drop(self, key: selectors.SelectorKey) -> None:
        key.data.finish()
        self._selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
        with self._closed:
            self._open[key.data.rank] -= 1
            self._closed.notify_all()
