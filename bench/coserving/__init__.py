"""Co-serving benches: a serving worker under replayed traffic lending its engine to rollout turns."""
