"""The kernel's own traffic shaping as a reference network: one network namespace per worker,
joined by veth pairs to a bridge that lives in a namespace of its own, every worker's NIC
limited to a rate each way by `tc`.

    worker i:  veth ──(egress: [netem delay L], tbf rate R)──┐
                                                              bridge (namespace hsnet<pid>-br)
    worker j:  veth <──(ingress: tbf rate R on the bridge port)┘

A message from i to j thus passes i's egress limit and then j's ingress limit, which is the
circuit `hetsync.network.model` charges: min(egress_i, ingress_j), and i's latency one way.
Everything lives in namespaces named after this process (hsnet<pid>-<i>, hsnet<pid>-br), so
concurrent runs do not clash and nothing touches the host's own interfaces; `close` deletes
the namespaces, which deletes their links and queues with them.

Choices, so that the shaping costs little CPU and distorts little:
- MTU 9000 (jumbo frames, as training clusters use) by default. At MTU 1500 a shaped TCP
  stream arrives in many small pieces and every gloo process wakes for each: on 2 cores an
  8-rank all-reduce then needed about 1 core and, on a loaded machine, took 1.15-1.6x the
  model's time, against 0.1 cores at 9000.
- tbf counts frames with their Ethernet, IP and TCP headers: a TCP stream delivers 8948 payload
  bytes per 9014 counted at MTU 9000 (99.3 % of R), 1448 per 1514 at MTU 1500 (95.6 %).
- tbf's bucket holds 64 KiB, so TCP's segmentation-offload packets pass whole instead of
  being cut into frames on a timer; it lets a transfer start at most 64 KiB ahead of the rate
  (5 ms at 100 Mbit/s). The queue holds 400 ms at R, so that an incast of several TCP flows
  queues instead of dropping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["IFNAME", "ShapedNetwork", "unavailable_reason"]

IFNAME = "veth"  # each worker's interface, inside its namespace (GLOO_SOCKET_IFNAME)
BURST = "64kb"  # tc's kb: KiB
QUEUE = "400ms"
MAX_WORKERS = 250  # one /24


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _tc(namespace: str, *args: str) -> None:
    done = subprocess.run(["tc", "-n", namespace, *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tc -n {namespace} {' '.join(args)}: {done.stderr.strip()}")


def unavailable_reason(latency: bool = False) -> str | None:
    """Why namespaces with shaped veth pairs (and delayed ones, with `latency`) cannot be made
    here, or None if they can: tried on a throw-away namespace, since only trying tells (root,
    a container's capabilities, the kernel's qdisc modules)."""
    if not shutil.which("ip") or not shutil.which("tc"):
        return "the `ip` and `tc` commands (iproute2) are not installed"
    probe = f"hsnet{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as e:
        return f"cannot create a network namespace ({e}); run as root where namespaces are allowed"
    try:
        _ip("-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name", "b")
        _tc(probe, "qdisc", "add", "dev", "a", "root", "tbf", "rate", "1mbit", "burst", BURST,
            "latency", QUEUE)
        if latency:
            _tc(probe, "qdisc", "add", "dev", "b", "root", "netem", "delay", "1ms")
    except RuntimeError as e:
        why = "delay packets (no netem in this kernel?)" if "netem" in str(e) else "shape a veth"
        return f"cannot {why} in a network namespace: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class ShapedNetwork:
    """`workers` namespaces on one bridge, unshaped until `shape`; a context manager that
    removes everything on exit, also after an exception or Ctrl-C."""

    def __init__(self, workers: int, mtu: int = 9000) -> None:
        if not 2 <= workers <= MAX_WORKERS:
            raise ValueError(f"a shaped network has 2 to {MAX_WORKERS} workers, not {workers}")
        self.workers = workers
        self.mtu = mtu
        self.prefix = f"hsnet{os.getpid()}"
        self.bridge = f"{self.prefix}-br"
        self.namespaces = [f"{self.prefix}-{i}" for i in range(workers)]
        self.ips = [f"10.77.0.{i + 1}" for i in range(workers)]
        self._made: list[str] = []

    def __enter__(self) -> ShapedNetwork:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        _ip("netns", "add", self.bridge)
        self._made.append(self.bridge)
        _ip("-n", self.bridge, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "add", "name", IFNAME, "type", "veth", "peer", "name",
                f"p{i}", "netns", self.bridge)
            _ip("-n", self.bridge, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.ips[i]}/24", "dev", IFNAME)
            _ip("-n", ns, "link", "set", IFNAME, "mtu", str(self.mtu), "up")
            _ip("-n", self.bridge, "link", "set", f"p{i}", "mtu", str(self.mtu))
            _ip("-n", ns, "link", "set", "lo", "up")

    def shape(self, rate_bit: float, latency_s: float = 0.0) -> None:
        """Limit every worker's egress and ingress to `rate_bit` bits/s, and delay what it sends
        by `latency_s`."""
        rate = ["tbf", "rate", f"{rate_bit:.0f}bit", "burst", BURST, "latency", QUEUE]
        for i, ns in enumerate(self.namespaces):
            if latency_s > 0:
                _tc(ns, "qdisc", "replace", "dev", IFNAME, "root", "handle", "1:", "netem",
                    "delay", f"{latency_s * 1e6:.0f}us", "limit", "100000")
                _tc(ns, "qdisc", "replace", "dev", IFNAME, "parent", "1:1", *rate)
            else:
                _tc(ns, "qdisc", "replace", "dev", IFNAME, "root", *rate)
            _tc(self.bridge, "qdisc", "replace", "dev", f"p{i}", "root", *rate)

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside worker `rank`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    def close(self) -> None:
        """Delete the namespaces (with their links and queues). Processes still inside keep a
        namespace alive, unnamed, until they exit: stop them first."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
