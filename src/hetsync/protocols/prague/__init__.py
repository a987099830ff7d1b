"""Prague (Luo et al., ASPLOS'20): Partial All-Reduce in groups from a Group Generator."""
