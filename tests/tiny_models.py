"""The smallest model build that still exercises every part of `rose models build`: for
tests that need real model directories in seconds."""
from rose.models.build import BuildSpec, Dims
from rose.models.warmup import WarmupSpec

TINY = BuildSpec(
    vocab_size=400,
    policy=Dims(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=64),
    serving=Dims(hidden=64, layers=1, heads=2, kv_heads=1, head_dim=32, intermediate=96, tied=False),
    demo_episodes={"frozenlake": 24, "guess": 12},
    warmup=WarmupSpec(steps=3, batch_size=4, warmup_steps=1),
)
