"""What a run measures: per-iteration logs, model snapshots, evaluation and the summary."""
