"""The `benchmarks` deployment offers the runnable benchmarks of bench/ only: scripts with a
__main__, not the modules they share nor the scripts that read their results."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.benchmarks import BenchRequest, benchmark_names


def test_only_runnable_benchmarks_are_offered():
    names = benchmark_names()
    assert {"transfer", "chaos", "cluster_sim", "paper_figures"} <= set(names)
    assert not {"result_file", "transfer_workloads", "paper_figures_32b", "paper_figures_plot",
                "results_doc"} & set(names)
    assert BenchRequest(scripts=["transfer", "chaos"]).scripts == ["transfer", "chaos"]
    for name in ("result_file", "paper_figures_plot", "../bench/transfer", "nothing"):
        with pytest.raises(ValidationError, match="no benchmark"):
            BenchRequest(scripts=[name])
