"""Hop's close() waits for its neighbours' end markers; a receive thread that fails meanwhile
(the neighbour died) ends that wait with its error, where it waited for good (review 4,
finding 4). Without a launcher, which would have ended the run itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two processes, ~10 s

SCRIPT = Path(__file__).parents[1] / "scripts" / "hop_peer_dies_at_close.py"


def test_a_receive_that_fails_while_closing_is_raised_not_waited_on(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], cwd=tmp_path, env={
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"},
        stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        _, err = procs[1].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 3
    assert procs[1].returncode != 0
    assert "hop receiver thread failed" in err, err
