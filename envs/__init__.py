"""The agentic environments rollouts play (FrozenLake, guess-the-number) behind one interface
(base.py) and a registry by name. Plain Python over numpy/gymnasium: they import no other ROSE
package (lint-imports checks it), so the trainer, the rollout workers and the model builder share
them.
"""
