"""The one way PanJoin serves gRPC: a server with health checking and server reflection.

Used by the worker (``panjoin.v1.Worker``), the handshake node and the manager
endpoint (``panjoin.v1.Manager``), so that any gRPC tool can list and call them. The
process's :class:`panjoin.security.Security` decides TLS, who may call (a client
certificate or a token; health checks stay open), the message limit, and whether it
may bind off loopback at all. The port is bound exclusively: a second server on a
busy port fails with :class:`BindError` instead of sharing its connections.

Long-lived streams (a worker's sessions, a handshake node's links and result streams)
each hold one of the server's threads while they live, so the servers that have them
cap them (``--max-sessions``, ``--max-chains``), refuse one more at once
(:func:`abort_full`), size their thread pool as the cap plus :data:`SPARE_THREADS`
(idle streams then never starve the short calls), and read each stream through
:func:`read_ahead`, so that a stream whose client sends nothing can be ended.
"""

from __future__ import annotations

import queue
import re
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from panjoin.security import Security, current

#: server threads besides the capped streams' (unary calls, health, reflection, refusals)
SPARE_THREADS = 8
#: what :func:`read_ahead`'s queue holds after a stream's last message
END = object()


class BindError(ValueError):
    """The server's address cannot be bound (the port is taken, the host is not ours)."""


def start_server(add_servicer, service_name: str, port: int = 0, host: str = "127.0.0.1",
                 max_workers: int = 16, security: Security | None = None,
                 serving: bool = True) -> tuple[grpc.Server, int]:
    """Start a server for one servicer under ``security`` (None: the process's, see
    :func:`panjoin.security.use`); returns it and its port (``port=0``: any free one).
    ``serving=False``: its health says NOT_SERVING until :func:`set_serving` (a worker
    that still compiles its kernels)."""
    sec = security or current()
    name = re.sub(r"(?<!^)(?=[A-Z])", "-", service_name.rsplit(".", 1)[-1]).lower()
    sec.check_bind(host, f"the {name} server")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=sec.server_options(), interceptors=sec.interceptors())
    add_servicer(server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection(
        (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    creds = sec.server_credentials()
    try:
        bound = (server.add_secure_port(f"{host}:{port}", creds) if creds is not None
                 else server.add_insecure_port(f"{host}:{port}"))
    except RuntimeError:  # grpc raises it where older versions returned 0
        bound = 0
    if bound == 0:
        raise BindError(f"cannot listen on {host}:{port}: the port is in use (another "
                        f"panjoin {name}?) or {host} is not an address of this host; pick "
                        "another --port (0: any free one) or --host")
    server.start()
    server.panjoin_health = (hs, service_name)
    if serving:
        set_serving(server)
    else:
        for svc in ("", service_name):
            hs.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, bound


class _Capture:
    """Stands in for a server while a generated ``add_*Servicer_to_server`` registers:
    keeps the service name and its method handlers."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict) -> None:
        self.name, self.handlers = name, handlers


def register(server, add_generated, servicer, serializers: dict | None = None) -> None:
    """Register ``servicer`` on ``server`` as the generated ``add_generated(servicer,
    server)`` does, with two changes: each request is parsed inside its rpc, so that
    bytes that are no message of the rpc's type end the call with INVALID_ARGUMENT
    (gRPC's own parsing answers INTERNAL, as if the server had failed); and
    ``serializers`` replaces response serialisers by method name (a manager's Join
    sends outputs it has encoded itself)."""
    cap = _Capture()
    add_generated(servicer, cap)
    handlers = {name: _parsing_inside(h, (serializers or {}).get(name))
                for name, h in cap.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(cap.name, handlers),))
    server.add_registered_method_handlers(cap.name, handlers)


def _parsing_inside(h, serializer=None):
    parse, ser = h.request_deserializer, serializer or h.response_serializer

    def one(raw, context):
        try:
            return parse(raw)
        except Exception as e:  # protobuf's DecodeError, or any parser's refusal
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"not a valid {_type_name(parse)} message: {e}")

    def many(raws, context):
        """The stream's messages; at one that does not parse, its end, with the call's
        status INVALID_ARGUMENT (the servicer, maybe on another thread, sees the stream
        end and releases what it holds)."""
        for raw in raws:
            try:
                msg = parse(raw)
            except Exception as e:
                context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                context.set_details(f"not a valid {_type_name(parse)} message: {e}")
                return
            yield msg

    if h.unary_unary:
        fn, make = (lambda r, c: h.unary_unary(one(r, c), c)), grpc.unary_unary_rpc_method_handler
    elif h.unary_stream:
        fn, make = (lambda r, c: h.unary_stream(one(r, c), c)), grpc.unary_stream_rpc_method_handler
    elif h.stream_unary:
        fn, make = (lambda it, c: h.stream_unary(many(it, c), c)), \
            grpc.stream_unary_rpc_method_handler
    else:
        fn, make = (lambda it, c: h.stream_stream(many(it, c), c)), \
            grpc.stream_stream_rpc_method_handler
    return make(fn, request_deserializer=None, response_serializer=ser)


def _type_name(parse) -> str:
    owner = getattr(parse, "__self__", None)
    return getattr(owner, "__name__", None) or getattr(parse, "__qualname__", "request")


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


def read_ahead(request_iterator, name: str = "stream-reader") -> queue.SimpleQueue:
    """A queue that a thread fills with a request stream's messages, then :data:`END`
    (also when the client cancels or goes away). The rpc's own thread waits on the
    queue with a timeout: blocked on the stream itself, it could not notice that the
    client has been idle, or that what it serves was released."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read():
        try:
            for m in request_iterator:
                inbox.put(m)
        except Exception:  # grpc.RpcError: the client went away
            pass
        inbox.put(END)

    threading.Thread(target=read, daemon=True, name=name).start()
    return inbox


def abort_full(context, holds: str, flag: str, fix: str, idle_timeout: float) -> None:
    """End a call with RESOURCE_EXHAUSTED: the server ``holds`` (e.g. "worker holds 64
    sessions") as many as its ``flag`` allows; ``fix``: what the caller can do first."""
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                  f"{holds}, its {flag}: {fix} (idle ones end after its --idle-timeout of "
                  f"{idle_timeout:g} s) or raise {flag}")
