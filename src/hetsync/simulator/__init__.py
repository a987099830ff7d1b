"""The simulator: every protocol's own cores on a virtual clock, 16 to 4096 workers.

Theory of operation. A simulation is a `Clock` (a heap of timed callbacks), the `Costs` of
compute, messages and central services, and one `SimWorker` per rank built by the protocol's
simulation (`hetsync.protocols.<name>.simulation`) around the protocol's cores, the very
classes real runs drive. Cores decide; the simulation turns each decision into timed callbacks
(a compute ending) and channel operations (`simulator.channel`, the twin of the real runs'
channel: a message arriving at its booked time, a collective ending when its last member
arrives) and feeds the resulting events back to the cores. Nothing here decides who
waits for whom: where a real run would block, a simulated worker is blocked until the event
its core waits for. An empty event queue with workers still waiting is a deadlock, reported
with what each waits for. `--math` adds the real numerical updates (`simulator.math`).
"""
