"""One transport layer owns the wire: only hetsync/transport/links.py calls torch.distributed's
communication, so that every buffer passes its link's device check before it travels (a CUDA
tensor can never reach gloo unnoticed). The one exception is torch's own
`DistributedDataParallel` (the ddp protocol wraps the model in it), whose collectives torch
makes itself; hetsync's hook on it reduces through a link like the rest."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import hetsync

SRC = Path(hetsync.__file__).parent
LINKS = SRC / "transport" / "links.py"
#: torch.distributed's communication: functions, and the raw process groups' methods.
OPS = {"send", "recv", "isend", "irecv", "all_reduce", "broadcast", "barrier",
       "batch_isend_irecv", "P2POp", "all_gather", "reduce_scatter", "reduce", "gather",
       "scatter", "all_to_all", "monitored_barrier", "broadcast_object_list",
       "all_gather_object", "send_object_list", "recv_object_list"}
RAW_OPS = {"allreduce", "allgather", "alltoall"}  # ProcessGroup methods, any receiver


def _dist_names(tree: ast.AST) -> set[str]:
    """The names this module gives torch.distributed (`import torch.distributed as dist`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            names |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    return names


def _is_dist(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in aliases
    return (isinstance(node, ast.Attribute) and node.attr == "distributed"
            and isinstance(node.value, ast.Name) and node.value.id == "torch")


def communication(path: Path) -> list[str]:
    """Where `path` uses torch.distributed's communication, as "line: name"."""
    tree = ast.parse(path.read_text())
    aliases = _dist_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                (node.attr in OPS and _is_dist(node.value, aliases)) or node.attr in RAW_OPS):
            found.append(f"{node.lineno}: {node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "torch.distributed"):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name in OPS]
    return found


def test_only_the_links_touch_the_wire():
    modules = [p for p in SRC.rglob("*.py") if p != LINKS]
    assert len(modules) > 50
    offences = [f"{p.relative_to(SRC)}:{where}" for p in modules for where in communication(p)]
    assert not offences, ("torch.distributed communication outside transport/links.py "
                          "(send it through a runtime.links Link): " + ", ".join(offences))


def test_the_check_sees_every_spelling(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import torch\nimport torch.distributed as d\n"
                      "from torch.distributed import isend\n"
                      "d.send(x, 1)\ntorch.distributed.all_reduce(x)\npg.allreduce([x])\n"
                      "link.send(x, 1)\n")
    assert sorted(communication(module)) == ["3: isend", "4: send", "5: all_reduce",
                                             "6: allreduce"]
    assert communication(LINKS)  # the one place that does


#: A message's duties, which its channel (hetsync.transport.channel) does for every driver.
DUTIES = re.compile(r"before_send|bytes_sent|\.blocking\(\)|self\.network\.(?!emulated\b)"
                    r"|network is (not )?None|unless_lost|after_blocking|hold_until"
                    r"|occupy\(")


def drivers() -> list[Path]:
    """Every protocol's driver modules: driver.py, a driver package's, a server's."""
    protocols = SRC / "protocols"
    return sorted({*protocols.glob("*/driver.py"), *protocols.glob("*/driver/*.py"),
                   *protocols.glob("*/server.py")})


def test_drivers_leave_every_duty_of_a_message_to_its_channel():
    found = drivers()
    assert len(found) >= 9
    offences = [f"{p.relative_to(SRC)}:{n}: {line.strip()}" for p in found
                for n, line in enumerate(p.read_text().splitlines(), 1) if DUTIES.search(line)]
    assert not offences, ("a driver does a message's duty itself (the channel's: "
                          "hetsync.transport.channel): " + "; ".join(offences))


def test_the_duty_check_sees_each_duty(tmp_path):
    lines = ["self.runtime.before_send()", "step.bytes_sent += 4", "with step.blocking():",
             "self.network.scaled(n)", "if network is None:", "unless_lost(lost, j, f)",
             "net.after_blocking(s, m, k, t)", "net.hold_until(s, t)", "net.occupy(m)"]
    assert all(DUTIES.search(line) for line in lines)
    assert not DUTIES.search("if self.network.emulated:")
    assert not DUTIES.search("self.channel.send(step, message, 1, tag)")
    assert not DUTIES.search("self.channel.busy_with(pattern, nbytes)")


#: A simulated message's duties, which its channel's twin (hetsync.simulator.channel) does for
#: every simulation: the network model's booking, the row's bytes and transfer time, the
#: arrival on the clock (dropped for a lost worker), a message pattern written out.
SIM_DUTIES = re.compile(r"\.deliver\(|payload_arrival|sim\.control\("
                        r"|\.network\.send\(|\.nics\b|\.charge\(|\bMessage\(|fan_out\("
                        r"|ring_allreduce\(|payload_bytes")


def simulations() -> list[Path]:
    return sorted((SRC / "protocols").glob("*/simulation.py"))


def test_simulations_leave_every_duty_of_a_message_to_its_channel():
    found = simulations()
    assert len(found) >= 8
    offences = [f"{p.relative_to(SRC)}:{n}: {line.strip()}" for p in found
                for n, line in enumerate(p.read_text().splitlines(), 1)
                if SIM_DUTIES.search(line)]
    assert not offences, ("a simulation does a message's duty itself (its channel's: "
                          "hetsync.simulator.channel): " + "; ".join(offences))


def test_the_simulation_duty_check_sees_each_duty():
    lines = ["sim.deliver(self.rank, dst, at, peer.receive, event)",
             "arrival = sim.payload_arrival(self.rank, partner)",
             "self.sim.control(self.rank, 0, self.gg.receive, event)",
             "sim.costs.network.send(messages, at=now)",
             "network.deliver(Message(self.rank, dst, nbytes), now, copies)",
             "sent = arrival - sim.costs.network.nics[self.rank].latency",
             "self.charge(nbytes=sim.costs.payload_bytes)",
             "messages = fan_out(self.rank, to, nbytes)"]
    assert all(SIM_DUTIES.search(line) for line in lines)
    assert not SIM_DUTIES.search("self.channel.control(dst, event)")
    assert not SIM_DUTIES.search("self.channel.send(self, 0, push)")
    assert not SIM_DUTIES.search("self.collectives.all_reduce(self.workers, receive, result)")
