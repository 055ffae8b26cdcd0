"""Weight transfer benches: the codec, the relay, publish and pull end to end."""
