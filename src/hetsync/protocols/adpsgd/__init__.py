"""AD-PSGD (Lian et al., ICML 2018): asynchronous atomic pairwise averaging."""
