"""Publishing and pulling policy weights over a relay: buckets, full snapshots and sparse deltas
(publisher.py, sparse_publisher.py with its per-tensor choice in tensor_form.py, receiver.py,
sharded_receiver.py, with the one full-snapshot wait both receivers share in snapshot_wait.py;
both take a version in through the one receive pipeline, apply_pipeline.py (pipelined, whole
or streamed), fed by bucket_fetch.py; stream_pull.py follows a delta's buckets while it is
still being published; first_read.py reads a small version's manifest and buckets in one
round trip),
a run's versions in the relay: their keys, manifests and commit (versions.py); a version
published as shards by each trainer rank (sharded_publisher.py), its commit (sharded_versions.py),
the weights digest both sides check (digest.py), and per-step transfer metrics. May import the
other storage packages (relay, delta, shards); nothing imports it from inside storage.
"""
