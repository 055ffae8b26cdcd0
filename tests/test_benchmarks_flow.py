"""The `benchmarks` deployment offers the runnable benchmarks of bench/'s families only: scripts
with a __main__, not the modules they share (bench/lib) nor the scripts that read their results;
each runs as `python -m bench.<family>.<name>`."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.benchmarks import BenchRequest, bench_module, benchmark_names


def test_only_runnable_benchmarks_are_offered():
    names = benchmark_names()
    assert {"transfer", "chaos", "cluster_sim", "paper_figures"} <= set(names)
    assert not {"results", "models", "__init__", "transfer_workloads", "paper_figures_32b", "paper_figures_plot",
                "results_doc"} & set(names)
    assert BenchRequest(scripts=["transfer", "chaos"]).scripts == ["transfer", "chaos"]
    assert (bench_module("transfer"), bench_module("chaos")) == ("bench.transfer.transfer", "bench.stack.chaos")
    for name in ("results", "paper_figures_plot", "../bench/transfer", "nothing"):
        with pytest.raises(ValidationError, match="no benchmark"):
            BenchRequest(scripts=[name])
