"""Test-wide settings and fixtures, read before any test module imports gRPC.

gRPC's fork handlers are for processes that fork without exec; here every fork is
followed by exec (worker processes, brokers, Spark's JVM, which pyspark starts with
``fork`` + ``preexec_fn``). With them on, a fork while this process's gRPC threads
are busy can break the child ("Java gateway process exited before sending its port
number", seen in CI when a test module's in-process manager was serving), so they
are off, as gRPC's documentation advises for fork + exec.

Fixtures for the Kafka and Spark tests (any test module may ask for them):

- ``brokers``: the session's real brokers by kind (``"noida"``, ``"tansu"``), started
  on first use and stopped at the end of the session;
- ``broker``: runs the test once on noida-db and once on Tansu;
- ``workers``: three worker processes per test module (tests/test_cluster.py,
  tests/test_streaming_cluster.py).

- ``gen_file``: makes an event file with ``panjoin gen`` (the CLI tests' inputs).
- ``aot_built``: the kernels compiled ahead of time (``make aot``) are current, or the
  test fails saying how to build them (``make test`` builds them first).

Topics get unique names (``kafka_helpers.topic``), so tests share a broker.
"""

import os

import pytest

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Polars sizes its thread pool once, when first imported, from POLARS_MAX_THREADS; the
# polars peer refuses to run on a pool of another size than it is asked for (one
# thread, as every peer of the benchmark). The first test module to import polars
# would otherwise fix the pool at one thread per core, before any test's run_peers
# could set the variable, and every later polars peer would fail.
os.environ.setdefault("POLARS_MAX_THREADS", "1")


@pytest.fixture(scope="session")
def aot_built():
    from panjoin.jit import ahead

    if ahead.module() is None:
        pytest.fail("the kernels compiled ahead of time are missing or stale: run `make aot` "
                    "(python -m panjoin.jit.build); `make test` builds them first")


@pytest.fixture(scope="module")
def workers():
    """Three real worker processes on loopback for a test module, stopped after it."""
    from panjoin.launch import start_workers

    ws = start_workers(3)
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(scope="session")
def brokers():
    started: dict = {}
    yield started
    for b in started.values():
        b.stop()


@pytest.fixture(params=["noida", "tansu"])
def broker(request, brokers):
    from panjoin.kafka.broker import start_broker

    kind = request.param
    b = brokers.get(kind)
    if b is None or not b.alive():
        b = brokers[kind] = start_broker(kind)
    return b


@pytest.fixture(scope="session")
def gen_file(tmp_path_factory):
    """``gen_file(*flags)``: an event file made by ``panjoin gen FLAGS`` in a fresh
    temporary directory (the CLI tests' inputs)."""
    from panjoin.cli.main import main

    def make(*flags: str):
        path = tmp_path_factory.mktemp("ev") / "events.parquet"
        assert main(["gen", str(path), *flags, "--no-progress"]) == 0
        return path

    return make
