"""A version's manifest and its first buckets in one relay round trip.

A receiver pulling a version once it is complete reads its manifest, then its buckets: two
round trips at least. Where the relay reads several keys at once (Relay.get_batch: Mooncake)
and the version held says what the next one likely looks like (a small model: one bucket,
the same every step), the manifest and the buckets it will name are asked for together, into
slots sized by the held version (Layout.limits): one round trip fewer per version (a WAN RTT;
~0.6 ms of a ~2.5 ms pull of the demo policy on this machine's loopback). A guessed bucket is
applied only if it passes the checksum the manifest gives it (else it is fetched again, as a
torn read is); one that outgrew its slot, or was not there, is fetched as usual.
"""
from __future__ import annotations

from dataclasses import dataclass

from storage.relay.base import Relay
from storage.weights.buckets import CorruptBucket, Manifest
from storage.weights.versions import bucket_key, manifest_key, read_manifest

GUESS_BYTES = 16 << 20  # read whole with the manifest up to this size (each value is copied)
MANIFEST_SLOT = (16 << 10, 1 << 10)  # room guessed for a manifest: base + per entry held


@dataclass(frozen=True)
class Layout:
    """What a version's buckets looked like: the guess for the next one."""

    buckets: tuple[int, ...]  # each bucket's bytes
    entries: int

    @classmethod
    def of(cls, manifest: Manifest) -> "Layout":
        return cls(tuple(b.nbytes for b in manifest.buckets),
                   sum(len(b.entries) for b in manifest.buckets))

    def limits(self) -> list[int]:
        """The most bytes to read for the manifest and each bucket: what the held version's
        took and an eighth more (a delta's coded sizes move a little from step to step), the
        first bucket room for the whole version (one that packs into fewer buckets fills
        it); one larger is read again on its own."""
        room = [n + n // 8 + 4096 for n in (sum(self.buckets), *self.buckets[1:])]
        return [MANIFEST_SLOT[0] + MANIFEST_SLOT[1] * self.entries] + room


def read_first(relay: Relay, run: str, version: int, guess: Layout | None
               ) -> tuple[Manifest, dict[int, memoryview]]:
    """The verified manifest of `version` and the buckets read with it (by index; none
    without a guess, a guess over GUESS_BYTES, or a relay without batched reads). Errors as
    versions.read_manifest's: a manifest missing or unreadable is read again that way."""
    values: list[memoryview | None] = []
    limits = guess.limits() if guess is not None and guess.buckets else []
    if limits and sum(limits) <= GUESS_BYTES:
        values = relay.get_batch([manifest_key(run, version)] +
                                 [bucket_key(run, version, i) for i in range(len(guess.buckets))],
                                 limits) or []
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
