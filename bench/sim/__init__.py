"""Simulator benches: the cluster simulator at scale, the paper's figures, and the profiles it reads."""
