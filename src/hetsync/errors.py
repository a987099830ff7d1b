"""Errors hetsync raises, so callers can tell a bad option from a failed run."""

from __future__ import annotations

__all__ = ["ConfigError", "Deadlock", "HetsyncError", "OutputFailed", "RunStopped",
           "WorkerFailed"]


class HetsyncError(Exception):
    """Base of every error hetsync raises on purpose."""


class ConfigError(HetsyncError, ValueError):
    """An option is wrong; raised before any process is spawned. The message is one line."""


class WorkerFailed(HetsyncError, RuntimeError):
    """A worker crashed, was killed or hung; the message names its rank and shows its stack.
    `own`: the worker itself failed (died, was stopped, hung while computing), rather than
    failing with its peers (a deadlock, a peer's failure echoing): a loss that
    `--on-failure continue` may go on without."""

    def __init__(self, rank: int, reason: str, details: str = "", own: bool = True) -> None:
        self.rank = rank
        self.reason = reason
        self.details = details
        self.own = own
        text = f"worker rank {rank} {reason}"
        super().__init__(f"{text}\n{details}".rstrip())


class OutputFailed(HetsyncError, RuntimeError):
    """A run's own files could not be written (a full disk, a folder made read-only): the
    message is one line naming the folder and the system's reason."""


class RunStopped(SystemExit):
    """`step()` called after the run stopped (--max-time, --max-iterations, the target loss, a
    `request_stop()`): the worker's part in the run is over, so its script ends here, with exit
    status 0 and no traceback, as `sys.exit(0)` would, and hetsync closes the run at exit. A
    loop that reads `optimizer.should_stop` (or uses `optimizer.iterate()`) never meets it
    and goes on after the loop. A SystemExit, not an Exception: a script's `except Exception`
    around its loop does not swallow the end of its run."""

    def __init__(self, reason: str) -> None:
        super().__init__(0)
        self.reason = reason


class Deadlock(HetsyncError, RuntimeError):
    """A simulated run cannot go on: no event is left, yet workers wait; names who waits."""


#: What a worker's error says when a peer failed first: follow-on errors, not causes.
FOLLOW_ON_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def is_follow_on(text: str) -> bool:
    """Whether an error text is a peer's failure echoing (see `FOLLOW_ON_MARKERS`)."""
    return any(marker in text for marker in FOLLOW_ON_MARKERS)


#: The stop reason of a worker whose script's loop ended by itself (its epochs ran out).
LOOP_ENDED = "loop ended after iteration"
