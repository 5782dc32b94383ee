"""pytest plugin of scripts/e2b-sdk-tests: which E2B SDK tests run in which phase.

--e2b-phase=offline  leaves out the tests that make a sandbox (those whose
                     fixtures include one of SANDBOX_FIXTURES): they need a
                     server by construction. Records the ids of the tests
                     that passed or were skipped in --e2b-done FILE.
--e2b-phase=live     leaves out the tests --e2b-done FILE lists: what did
                     not pass offline runs against the server.

With E2B_SDK_RESOLVE_DOMAIN set, every name under that domain resolves to
127.0.0.1 in the test processes: the wildcard DNS an operator gives
`cordon serve --sandbox-domain`, for this machine alone (what the tests
that fetch `sandbox.get_host(port)` need).
"""

import os
import socket

import pytest

_RESOLVE = os.environ.get("E2B_SDK_RESOLVE_DOMAIN", "").lower()
if _RESOLVE:
    _getaddrinfo = socket.getaddrinfo

    def _resolve(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and name.lower().endswith("." + _RESOLVE):
            host = "127.0.0.1"
        return _getaddrinfo(host, *args, **kwargs)

    socket.getaddrinfo = _resolve

SANDBOX_FIXTURES = {"sandbox", "sandbox_factory", "async_sandbox", "async_sandbox_factory"}


def pytest_addoption(parser):
    group = parser.getgroup("e2b-sdk-tests")
    group.addoption("--e2b-phase", choices=("offline", "live"), default=None)
    group.addoption("--e2b-done", default=None, help="ids of the tests that passed offline")


def _done_ids(config):
    path = config.getoption("e2b_done")
    if not path or not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n") for line in f if line.strip()}


def pytest_collection_modifyitems(config, items):
    phase = config.getoption("e2b_phase")
    if phase == "offline":
        drop = [i for i in items if SANDBOX_FIXTURES & set(getattr(i, "fixturenames", ()))]
    elif phase == "live":
        done = _done_ids(config)
        drop = [i for i in items if i.nodeid in done]
    else:
        return
    if drop:
        dropped = set(map(id, drop))
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if id(i) not in dropped]


class _Recorder:
    def __init__(self, path):
        self.path = path
        self.outcome = {}

    def pytest_runtest_logreport(self, report):
        # A test passed if every phase of it did; skipped counts as done.
        prev = self.outcome.get(report.nodeid, "passed")
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped and prev == "passed":
            self.outcome[report.nodeid] = "skipped"
        else:
            self.outcome.setdefault(report.nodeid, prev)

    def pytest_sessionfinish(self, session):
        with open(self.path, "w", encoding="utf-8") as f:
            for nodeid, outcome in sorted(self.outcome.items()):
                if outcome != "failed":
                    f.write(nodeid + "\n")


def pytest_configure(config):
    # The controller records (under xdist the workers' reports reach it too).
    if (
        config.getoption("e2b_phase") == "offline"
        and config.getoption("e2b_done")
        and not hasattr(config, "workerinput")
    ):
        config.pluginmanager.register(_Recorder(config.getoption("e2b_done")), "e2b-sdk-recorder")
