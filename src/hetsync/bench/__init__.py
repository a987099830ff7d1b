"""`hetsync bench`: the papers' comparisons as one command (see docs/benchmarks.md).

A suite (suites.py) is planned and run (runner.py) into one folder, then reduced to medians and
ratios (results.py) and written as results.json and results.md with plots (markdown.py);
command.py ties them together. Importing this package is cheap; its modules import torch.
"""
