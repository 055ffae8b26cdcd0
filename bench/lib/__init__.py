"""What several benches share: the one writer of their JSON, and the demo models a stack bench needs."""
