"""Test-wide settings, read before any test module imports gRPC.

gRPC's fork handlers are for processes that fork without exec; here every fork is
followed by exec (worker processes, brokers, Spark's JVM, which pyspark starts with
``fork`` + ``preexec_fn``). With them on, a fork while this process's gRPC threads
are busy can break the child ("Java gateway process exited before sending its port
number", seen in CI when a test module's in-process manager was serving), so they
are off, as gRPC's documentation advises for fork + exec.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
