"""The one way PanJoin serves gRPC: a server with health checking and server reflection.

Used by the worker (``panjoin.v1.Worker``) and the manager endpoint
(``panjoin.v1.Manager``), so that any gRPC tool can list and call both.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

#: arrays travel packed; a batch of a few million tuples must fit in one message
OPTIONS = [("grpc.max_receive_message_length", 1 << 30),
           ("grpc.max_send_message_length", 1 << 30)]


def start_server(add_servicer, service_name: str, port: int = 0, host: str = "127.0.0.1",
                 max_workers: int = 16, serving: bool = True) -> tuple[grpc.Server, int]:
    """Start a server for one servicer; returns it and its port (``port=0``: any free one).
    ``serving=False``: its health says NOT_SERVING until :func:`set_serving` (a worker
    that still compiles its kernels)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=OPTIONS)
    add_servicer(server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}; is the port in use?")
    server.start()
    server.panjoin_health = (hs, service_name)
    if serving:
        set_serving(server)
    else:
        for name in ("", service_name):
            hs.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, bound


def set_serving(server: grpc.Server) -> None:
    """Have a server from :func:`start_server` report SERVING on its health service."""
    hs, service_name = server.panjoin_health
    for name in ("", service_name):
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)


def serve_until_stopped(stop_fn) -> int:
    """Block until SIGTERM or Ctrl-C, then call ``stop_fn`` (a server's or a broker's
    stop); the exit status of a process that was asked to stop: 0."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    stop_fn()
    return 0
