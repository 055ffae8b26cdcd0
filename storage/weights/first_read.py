"""A version's manifest and its first buckets in one relay round trip.

A receiver pulling a version once it is complete reads its manifest, then its buckets: two
round trips at least. Where the relay reads several keys at once (Relay.get_batch: Mooncake)
and the version held says what the next one likely looks like (a small model: one bucket,
the same every step), the manifest and the buckets it will name are asked for together: one
round trip fewer per version (a WAN RTT; ~0.5 ms of a ~4 ms pull of the demo policy on this
machine's loopback). A guessed bucket is applied only if it passes the checksum the manifest
gives it (else it is fetched again, as a torn read is); a guess that misses costs nothing
but the read of what was there.
"""
from __future__ import annotations

from dataclasses import dataclass

from storage.relay.base import Relay
from storage.weights.buckets import CorruptBucket, Manifest
from storage.weights.publisher import bucket_key, manifest_key, read_manifest

GUESS_BYTES = 16 << 20  # read whole with the manifest up to this size (each value is copied)


@dataclass(frozen=True)
class Layout:
    """What a version's buckets looked like: the guess for the next one."""

    buckets: int
    nbytes: int

    @classmethod
    def of(cls, manifest: Manifest) -> "Layout":
        return cls(len(manifest.buckets), sum(b.nbytes for b in manifest.buckets))


def read_first(relay: Relay, run: str, version: int, guess: Layout | None
               ) -> tuple[Manifest, dict[int, memoryview]]:
    """The verified manifest of `version` and the buckets read with it (by index; none
    without a guess, a guess over GUESS_BYTES, or a relay without batched reads). Errors as
    publisher.read_manifest's: a manifest missing or unreadable is read again that way."""
    values: list[memoryview | None] = []
    if guess is not None and 0 < guess.nbytes <= GUESS_BYTES:
        values = relay.get_batch([manifest_key(run, version)] +
                                 [bucket_key(run, version, i) for i in range(guess.buckets)]) or []
    batched = values[0] if values else None
    try:
        manifest = read_manifest(relay, run, version, value=batched)
    except CorruptBucket:
        if batched is None:
            raise
        manifest = read_manifest(relay, run, version)  # a torn or stale copy: read it alone
    # kept whatever the manifest's read: each bucket is checked against it before use
    return manifest, {i: blob for i, blob in enumerate(values[1:len(manifest.buckets) + 1])
                      if blob is not None}
