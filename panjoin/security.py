"""Who may talk to a PanJoin server, and how large a message may be: one config
(:class:`Security`), one function that makes every channel (:func:`channel`), and
the server half (:func:`server_credentials`, the token check) that
:func:`panjoin.serving.start_server` uses.

The rules, for every server (worker, handshake node, manager):

* on loopback, plaintext is allowed (the default: tests, ``panjoin cluster``);
* ``--tls-cert``/``--tls-key``: the server speaks TLS with this certificate;
* its clients authenticate by a token when it has one (``--auth-token-file``: the
  manager), else by a certificate signed by ``--tls-ca`` (mutual TLS: workers and
  handshake nodes accept only their managers and neighbours);
* off loopback (e.g. ``--host 0.0.0.0``) a server without TLS and a way to
  authenticate its clients refuses to start, unless ``--insecure`` (a trusted network).

A client uses the same flags: ``--tls-ca`` to check the server's certificate,
``--tls-cert``/``--tls-key`` as its own (the manager's, towards its workers), and
``--auth-token-file`` to send ``authorization: Bearer <token>`` to the manager::

    ca.pem --signs--> worker.pem, manager.pem
    panjoin worker  --host 0.0.0.0 --tls-cert worker.pem --tls-key worker.key --tls-ca ca.pem
    panjoin manager --host 0.0.0.0 --workers w1:50051 --tls-cert manager.pem \\
        --tls-key manager.key --tls-ca ca.pem --auth-token-file token
    panjoin replay ev.parquet --cluster m:50050 --tls-ca ca.pem --auth-token-file token ...

A process states its flags once (:func:`use`, the CLI does it); every channel and
server it makes afterwards follows them, and :mod:`panjoin.launch` passes them on
to the processes it starts.

grpc is imported where a channel, a credential or an interceptor is made, not with
this module: a process that never opens one (an in-process ``panjoin replay``)
need not pay its import (about 0.1 s).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

#: the default cap on one message, in MiB (``--max-message-mb`` raises it)
MAX_MESSAGE_MB = 64
#: the cap on a worker's answers to the manager that connected to it (mutually
#: authenticated): a probe's pairs come in one message, and a 32K-tuple batch at 64
#: partners a tuple is already 48 MiB of them
PEER_ANSWER_BYTES = 1 << 30
#: methods that answer without a token: a load balancer's or the launcher's health check
OPEN_METHODS = ("/grpc.health.v1.Health/",)


class SecurityError(ValueError):
    """A server or channel that would be unprotected, or a config that cannot work."""


@dataclass(frozen=True)
class Security:
    """TLS files (PEM paths), a token file, ``insecure`` and the message limit."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    token_file: str | None = None
    insecure: bool = False
    max_message_mb: int = MAX_MESSAGE_MB

    def __post_init__(self):
        if (self.cert is None) != (self.key is None):
            raise SecurityError("--tls-cert and --tls-key go together: give both (the "
                                "certificate and its private key) or neither")
        if not self.max_message_mb >= 1:
            raise SecurityError(f"--max-message-mb must be at least 1, got "
                                f"{self.max_message_mb}")
        for name, path in (("--tls-cert", self.cert), ("--tls-key", self.key),
                           ("--tls-ca", self.ca), ("--auth-token-file", self.token_file)):
            if path is not None and not Path(path).is_file():
                raise SecurityError(f"{name} {path}: no such file")
        if self.token_file is not None and not self.token():
            raise SecurityError(f"--auth-token-file {self.token_file} is empty; put a long "
                                "random token in it (e.g. 'openssl rand -hex 32')")

    @classmethod
    def from_args(cls, args) -> Security:
        """The config of parsed flags (:func:`panjoin.cli.options.add_security`)."""
        return cls(getattr(args, "tls_cert", None), getattr(args, "tls_key", None),
                   getattr(args, "tls_ca", None), getattr(args, "auth_token_file", None),
                   getattr(args, "insecure", False),
                   getattr(args, "max_message_mb", None) or MAX_MESSAGE_MB)

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb << 20

    def token(self) -> str | None:
        if self.token_file is None:
            return None
        return Path(self.token_file).read_text().strip()

    def argv(self, token: bool = True) -> list[str]:
        """These settings as flags of a ``panjoin`` command (``token``: with the token
        file, for a manager; workers authenticate their clients by certificate)."""
        a = []
        for flag, v in (("--tls-cert", self.cert), ("--tls-key", self.key),
                        ("--tls-ca", self.ca),
                        ("--auth-token-file", self.token_file if token else None)):
            if v is not None:
                a += [flag, str(v)]
        if self.insecure:
            a.append("--insecure")
        if self.max_message_mb != MAX_MESSAGE_MB:
            a += ["--max-message-mb", str(self.max_message_mb)]
        return a

    # ------------------------------------------------------------------ server side

    def server_options(self) -> list[tuple]:
        """A server takes messages up to the limit, binds its port alone (no
        SO_REUSEPORT: a second server on a busy port fails instead of sharing it), and
        may send up to :data:`PEER_ANSWER_BYTES` (its clients cap what they take)."""
        return [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", max(self.max_message_bytes,
                                                     PEER_ANSWER_BYTES)),
                ("grpc.so_reuseport", 0)]

    def check_bind(self, host: str, what: str) -> None:
        """Refuse to serve ``what`` unprotected off loopback (see the module docstring)."""
        if self.insecure or is_loopback(host):
            return
        missing = []
        if self.cert is None:
            missing.append("TLS (--tls-cert, --tls-key)")
        if self.token_file is None and self.ca is None:
            missing.append("client authentication (--tls-ca for mutual TLS; the manager: "
                           "--auth-token-file)")
        if missing:
            raise SecurityError(
                f"{what} would listen on {host}, off loopback, without "
                f"{' and '.join(missing)}; give them, bind 127.0.0.1, or add --insecure "
                "on a trusted network")

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials of a server (None: plaintext). Without a token, a CA means
        mutual TLS: a client must show a certificate signed by it."""
        if self.cert is None:
            return None
        import grpc

        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))],
            root_certificates=_read(self.ca) if self.ca else None,
            require_client_auth=self.ca is not None and self.token_file is None)

    def interceptors(self) -> list:
        """A server's interceptors: the token check when there is a token."""
        tok = self.token()
        return [_interceptors().TokenCheck(tok)] if tok else []

    # ------------------------------------------------------------------ client side

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials of a channel (None: plaintext): the CA checks the server's
        certificate (None: the system's roots), the certificate is ours."""
        if self.cert is None and self.ca is None:
            return None
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None,
            private_key=_read(self.key) if self.key else None,
            certificate_chain=_read(self.cert) if self.cert else None)


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, ``[::1]``, ``localhost``: yes; ``0.0.0.0``, a name: no."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------- the process's


_current = Security()


def use(security: Security) -> Security:
    """Make ``security`` this process's settings (returns the previous ones)."""
    global _current
    old, _current = _current, security
    return old


def current() -> Security:
    return _current


def channel(address: str, security: Security | None = None, *, token: bool = False,
            peer: bool = False) -> grpc.Channel:
    """The one way PanJoin connects: a channel to ``address`` under ``security`` (None:
    the process's). ``token``: send the token (a client of the manager); ``peer``: a
    worker's or node's answers may exceed the message limit (:data:`PEER_ANSWER_BYTES`).
    A token never goes in plaintext off loopback (unless ``insecure``)."""
    import grpc

    sec = security or _current
    receive = max(sec.max_message_bytes, PEER_ANSWER_BYTES) if peer else sec.max_message_bytes
    options = [("grpc.max_receive_message_length", receive),
               ("grpc.max_send_message_length", sec.max_message_bytes)]
    creds = sec.channel_credentials()
    ch = (grpc.secure_channel(address, creds, options=options) if creds is not None
          else grpc.insecure_channel(address, options=options))
    tok = sec.token() if token else None
    if tok:
        if creds is None and not sec.insecure and not is_loopback(address.rsplit(":", 1)[0]):
            ch.close()
            raise SecurityError(f"the token would travel in plaintext to {address}; give "
                                "--tls-ca (the manager's CA), or --insecure on a trusted "
                                "network")
        ch = grpc.intercept_channel(ch, _interceptors().AddToken(tok))
    return ch


# ---------------------------------------------------------------------- tokens


_Details = namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                   "wait_for_ready", "compression"))


@functools.cache
def _interceptors():
    """The interceptor classes, made on the first call: they subclass grpc's, and
    importing grpc is what this module leaves to its first channel or server."""
    import grpc

    class CallDetails(_Details, grpc.ClientCallDetails):
        pass

    class AddToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        """Adds ``authorization: Bearer <token>`` to every call (metadata, so the same
        channel serves TLS and loopback plaintext)."""

        def __init__(self, token: str):
            self.md = ("authorization", f"Bearer {token}")

        def _with(self, d):
            return CallDetails(d.method, d.timeout, [*(d.metadata or ()), self.md],
                               d.credentials, d.wait_for_ready, d.compression)

        def intercept_unary_unary(self, continuation, details, request):
            return continuation(self._with(details), request)

        def intercept_unary_stream(self, continuation, details, request):
            return continuation(self._with(details), request)

        def intercept_stream_unary(self, continuation, details, requests):
            return continuation(self._with(details), requests)

        def intercept_stream_stream(self, continuation, details, requests):
            return continuation(self._with(details), requests)

    class TokenCheck(grpc.ServerInterceptor):
        """Every call but a health check needs ``authorization: Bearer <token>``
        (UNAUTHENTICATED otherwise), reflection included; the servicers never see it."""

        def __init__(self, token: str):
            self.want = f"Bearer {token}".encode()

        def intercept_service(self, continuation, details):
            handler = continuation(details)
            if handler is None or details.method.startswith(OPEN_METHODS):
                return handler
            got = dict(details.invocation_metadata or ()).get("authorization", "")
            if hmac.compare_digest(got.encode() if isinstance(got, str) else got, self.want):
                return handler
            return _deny(handler, "missing authorization metadata" if not got else
                         "wrong token")

    return SimpleNamespace(AddToken=AddToken, TokenCheck=TokenCheck)


def _deny(handler: grpc.RpcMethodHandler, why: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED."""
    import grpc

    msg = (f"{why}: this manager needs 'authorization: Bearer <token>' "
           "(panjoin: --auth-token-file FILE)")

    def abort(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, msg)

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    return kinds[(handler.request_streaming, handler.response_streaming)](abort)
