"""Suite order and shared set-ups.

Modules with end-to-end (`slow`) tests run after all the others (before them under
pytest-xdist), those on the shared stack first among them; a module is moved whole, so its
module fixtures start once. The local models start building in a process of their own as soon
as tests marked `models` are collected: on a 2-core machine the single-threaded build overlaps
the other tests instead of holding up the first test on the models. The shared stack stops as
soon as the last test using it is done.
"""
from __future__ import annotations

import pytest

from tests.stack_fixtures import SharedStack, start_model_build, stop_model_build

SHARED = "shared_stack"
_waiting_for_shared: set[str] = set()  # node ids of the tests still to use the shared stack
_shared: list[SharedStack] = []


def _module(item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items) -> None:
    slow = {_module(item) for item in items if item.get_closest_marker("slow")}
    shared = {_module(item) for item in items if SHARED in getattr(item, "fixturenames", ())}
    # stable: file order kept within each part. Run by pytest-xdist's workers (`make test`),
    # the slow modules go first: a minute-long test started last holds the run's tail alone.
    slow_first = hasattr(config, "workerinput")
    items.sort(key=lambda item: ((_module(item) in slow) != slow_first, _module(item) not in shared))


def pytest_collection_finish(session) -> None:
    _waiting_for_shared.update(item.nodeid for item in session.items
                               if SHARED in getattr(item, "fixturenames", ()))
    if any(item.get_closest_marker("models") for item in session.items):
        start_model_build(session.config._tmp_path_factory)


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory):
    stack = SharedStack(tmp_path_factory)
    _shared.append(stack)
    stack.start()
    yield stack
    stack.stop()  # a no-op when the last user already stopped it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the item's own (and, leaving its module, the module's) fixtures are torn down
    _waiting_for_shared.discard(item.nodeid)
    if _shared and not _waiting_for_shared:
        _shared[0].stop()


def pytest_sessionfinish(session, exitstatus) -> None:
    stop_model_build()  # one no test waited for must not outlive the session
