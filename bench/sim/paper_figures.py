"""The ROSE paper's figures at the paper's scale, simulated (sim/), beside the paper's numbers.

    python -m bench.sim.paper_figures [--steps 3] [--fit] [--fleet h100_qwen3_8b]
    python -m bench.sim.paper_figures --only-32b   # the Qwen3-32B / ALFWorld rows alone, into the existing JSON

Prints the figures beside the paper's numbers and writes bench/results/paper_figures.json, with one
PNG per figure beside it (bench/sim/paper_figures_plot.py). The simulations, their settings and
the figures' rows are sim/paper_figures.py's (and sim/paper_figures_32b.py's), which the
`paper-figures` deployment (flows/paper_figures.py) runs on Dask workers.
"""
from __future__ import annotations

from bench.lib.results import RESULTS, write_json
from sim.paper_figures import parser, write_figures

OUT = RESULTS / "paper_figures.json"


def main(argv: list[str] | None = None) -> dict:
    """Run the figures (`argv`: this script's arguments), print and write them with their PNGs;
    their fields (with --only-32b, the 32B rows)."""
    args = parser(OUT).parse_args(argv)
    fields = write_figures(args, write_json)
    if fields["fig7a"] and not args.only_32b:  # the plots draw Fig. 7a's runs
        from bench.sim.paper_figures_plot import plot
        print("wrote " + ", ".join(str(p) for p in plot(fields | {"args": vars(args)}, args.out.parent)))
    return fields


if __name__ == "__main__":
    main()
