"""The rounds of a synchronous parameter server, with backup workers; no I/O.

Theory of operation. Round v collects gradients computed on model version v. With `backup` b
it closes at the first n - b of them (Chen et al. 2016, "Revisiting Distributed Synchronous
SGD"): the server applies their mean, moves to version v + 1 and answers those n - b workers.
The up to b others are still computing on v; when their push arrives the round is closed, so
their gradient is dropped (counted in `dropped`) and they are answered at once with the
current model, which they catch up to. A slow worker therefore never holds back a round, and
every push is answered exactly once. With b = 0 a round waits for every live worker and
nothing is ever dropped. A worker that leaves is no longer waited for: a round needs
min(n - b, live) gradients.

At least n - b workers compute on each new version (the round's members), so every round
closes. Stop votes are OR-ed over all pushes, dropped ones included, into the open round.
The first round to close after a vote carries stop, and so does every reply after it: each
worker stops at its first reply from then on, all holding the same final model. With b = 0
that is the same iteration for all; with b > 0 the late workers have completed fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsync.cores.errors import RemoteProtocolError
from hetsync.cores.events import FROZEN

__all__ = ["Decision", "Reply", "SyncRounds"]


@dataclass(**FROZEN)
class Reply:
    """Answer `ranks` with the model at `version`, after applying the mean of the round's
    `applied` gradients (0: apply nothing, a dropped push's reply)."""

    ranks: tuple[int, ...]
    version: int
    applied: int
    staleness: int
    """Versions the model had moved past the pushed one: 0, or > 0 for a dropped gradient."""
    stop: bool


@dataclass(**FROZEN)
class Decision:
    """What to do with a push: add it to the round's sums if `accept`, then send `reply`."""

    accept: bool
    reply: Reply | None


class SyncRounds:
    """Round bookkeeping of the sync parameter server (see the module doc)."""

    def __init__(self, world: int, backup: int = 0) -> None:
        if not 0 <= backup < world:
            raise ValueError(f"backup must be in 0..{world - 1} (got {backup})")
        self.quorum, self.live = world - backup, world
        self.version = 0
        self.members: list[int] = []
        self.vote = self.stopped = False
        self.dropped = 0

    def push(self, rank: int, version: int, vote: bool) -> Decision:
        """`rank` pushed a gradient computed on `version`, with its stop vote."""
        if version > self.version:
            raise RemoteProtocolError(f"ps: rank {rank} pushed for version {version}, "
                                      f"the round is for {self.version}")
        self.vote = self.vote or vote
        if version < self.version:  # its round closed without it
            self.dropped += 1
            return Decision(accept=False, reply=Reply(
                ranks=(rank,), version=self.version, applied=0,
                staleness=self.version - version, stop=self.stopped))
        self.members.append(rank)
        return Decision(accept=True, reply=self._close())

    def leave(self) -> Reply | None:
        """A worker left (after its last reply): rounds no longer wait for it."""
        self.live -= 1
        return self._close()

    def _close(self) -> Reply | None:
        if not self.members or len(self.members) < min(self.quorum, self.live):
            return None
        ranks, self.members = tuple(self.members), []
        self.stopped, self.vote = self.stopped or self.vote, False
        self.version += 1
        return Reply(ranks=ranks, version=self.version, applied=len(ranks), staleness=0,
                     stop=self.stopped)
