"""Publishing and pulling policy weights over a relay: buckets, full snapshots and sparse deltas
(publisher.py, sparse_publisher.py, receiver.py), and per-step transfer metrics. May import the
other storage packages (relay, delta, shards); nothing imports it from inside storage.
"""
