"""Shared fixtures: a real Mooncake master + metadata server, and relay pairs over it.

Import the fixtures into a test module (`from mooncake_fixtures import mooncake, ...`). Tests
that need Mooncake skip only when the mooncake package cannot import.
"""
from __future__ import annotations

import pytest

from storage.relay.filesystem import FilesystemRelay

try:
    import mooncake.store  # noqa: F401
    MOONCAKE_IMPORT_ERROR = None
except ImportError as e:  # e.g. the Debian package libibverbs1 is missing
    MOONCAKE_IMPORT_ERROR = str(e)


def skip_without_mooncake() -> None:
    if MOONCAKE_IMPORT_ERROR:
        pytest.skip(f"mooncake.store does not import: {MOONCAKE_IMPORT_ERROR}")


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake

    services = start_mooncake(tmp_path_factory.mktemp("mooncake"))
    yield services
    services.stop()


@pytest.fixture(scope="module")
def mooncake_pair(mooncake):
    """A publisher (owns a segment) and a reader (no segment), like trainer and rollout."""
    from storage.relay.mooncake import MooncakeRelay

    writer = MooncakeRelay(mooncake.master_addr, mooncake.metadata_url, segment_bytes=256 << 20,
                           local_buffer_bytes=16 << 20)
    reader = MooncakeRelay(mooncake.master_addr, mooncake.metadata_url, segment_bytes=0,
                           local_buffer_bytes=16 << 20)
    yield writer, reader
    reader.close()
    writer.close()


@pytest.fixture(params=["filesystem", "mooncake"])
def relays(request, tmp_path):
    """(writer, reader) of one kind; tests keep their keys apart with `ns`."""
    if request.param == "filesystem":
        relay = FilesystemRelay(tmp_path / "relay")
        return relay, relay
    return request.getfixturevalue("mooncake_pair")


@pytest.fixture
def ns(request):
    """A key prefix unique to the test (Mooncake fixtures are shared by a module)."""
    return "t/" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in request.node.name)
