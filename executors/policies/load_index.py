"""Workers bucketed by in-flight load, for the router's O(log D) least-loaded pick."""
from __future__ import annotations

import bisect
from collections.abc import Iterator


class LoadIndex:
    """Workers of one kind bucketed by in-flight load; non-empty loads kept sorted.

    Within a bucket, insertion order breaks ties: the worker that has sat at that load longest
    comes first, which spreads turns round-robin among equally loaded workers.
    """

    def __init__(self) -> None:
        self._bucket: dict[int, dict[str, None]] = {}
        self._loads: list[int] = []

    def add(self, name: str, load: int) -> None:
        bucket = self._bucket.get(load)
        if bucket is None:
            bucket = self._bucket[load] = {}
            bisect.insort(self._loads, load)
        bucket[name] = None

    def discard(self, name: str, load: int) -> None:
        bucket = self._bucket[load]
        del bucket[name]
        if not bucket:
            del self._bucket[load]
            del self._loads[bisect.bisect_left(self._loads, load)]

    def least(self) -> tuple[str, int] | None:
        if not self._loads:
            return None
        load = self._loads[0]
        return next(iter(self._bucket[load])), load

    def ascending(self) -> Iterator[str]:
        for load in self._loads:
            yield from self._bucket[load]
