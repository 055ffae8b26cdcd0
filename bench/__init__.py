"""Benchmarks of ROSE, by family; each script runs from the repo root as `python -m bench.<family>.<name>`.

transfer: weight transfer (codec, relay, publish and pull); coserving: a serving worker lending its
engine; sim: the cluster simulator and the profiles it reads; learning: what borrowing and the
trainer backends do to learning; stack: the local stack end to end (step, demo, scheduler,
reward, co-execution, chaos); lib: what they share (the one JSON writer, the demo models).
Results go to bench/results; bench/results_doc.py writes docs/results.md from them.
"""
