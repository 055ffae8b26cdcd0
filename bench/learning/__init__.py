"""Learning benches: held-out success with and without borrowing, and the trainer backends."""
