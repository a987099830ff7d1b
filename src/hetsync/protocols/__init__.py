"""The protocols: one package each (see `catalog`), found by name through `registry`.

Empty on purpose: importing a protocol's options or decisions (`hetsync.protocols.<x>.options`,
`.core`) runs this file, which must therefore import no driver and no torch.
"""
