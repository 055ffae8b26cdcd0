"""Local-stack benches: one RL step by phase, the demo from a fresh clone, scheduling, reward, co-execution, chaos."""
