"""D-PSGD (Lian et al., NeurIPS 2017): synchronous neighbourhood averaging on a graph."""
