"""Shared checks of the protocol cores."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from hetsync.cores.errors import LocalProtocolError


@pytest.fixture
def assert_refused() -> Callable[..., None]:
    """Feed `events` to `core`; the last must raise `error` matching `match`, leave the core in
    its ERROR state, and make every later call raise (h11's rule: a broken core stays broken)."""

    def check(core, events: Sequence[object], error: type[Exception], match: str,
              then: object) -> None:
        with pytest.raises(error, match=match):
            for event in events:
                core.handle(event)
        assert core.state.name == "ERROR"
        with pytest.raises(LocalProtocolError, match="ERROR"):
            core.handle(then)

    return check
