"""Local SGD with periodic averaging, and its DiLoCo form (outer Nesterov on the average)."""
