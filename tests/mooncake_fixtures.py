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


TEST_KEYS = "t"  # every test key starts with it: `ns` ("t/<test>") and run names made from it


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


@pytest.fixture(scope="module")
def mooncake_shared_pair(mooncake):
    """Publisher and reader as `rose up` opens them: dummy clients of the stack's store client,
    every transfer through memory shared with it."""
    from storage.relay.mooncake import MooncakeRelay

    if not mooncake.client_addr:
        pytest.fail(f"the Mooncake store client did not start: {mooncake.client_error}")
    writer, reader = (MooncakeRelay(mooncake.master_addr, mooncake.metadata_url, segment_bytes=0,
                                    local_buffer_bytes=16 << 20,
                                    client_addr=mooncake.client_addr) for _ in range(2))
    yield writer, reader
    reader.close()
    writer.close()


@pytest.fixture(params=["filesystem", "mooncake", "mooncake-shared"])
def relays(request, tmp_path):
    """(writer, reader) of one kind; tests keep their keys apart with `ns`. The Mooncake pairs
    are shared by a module: what a test put is removed after it, so no test runs on space (or
    objects) that another one left, whichever tests a selection runs before it."""
    if request.param == "filesystem":
        relay = FilesystemRelay(tmp_path / "relay")
        yield relay, relay
        return
    writer, reader = request.getfixturevalue(
        "mooncake_pair" if request.param == "mooncake" else "mooncake_shared_pair")
    yield writer, reader
    writer.remove_prefix(TEST_KEYS)


@pytest.fixture
def ns(request):
    """A key prefix unique to the test (Mooncake fixtures are shared by a module)."""
    return TEST_KEYS + "/" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in request.node.name)
