"""TLS, tokens and limits over real processes on loopback (panjoin.security).

A CA and a certificate for 127.0.0.1 are made here (the ``cryptography`` package),
and a second, rogue CA with its own certificate. The cluster runs with mutual TLS
between the manager and its workers and a token on the manager's endpoint; its
joins must be exact, and every caller without the right CA, certificate or token
must be refused (health checks stay open). A second cluster runs with a 1 MiB
message limit: what the client and the manager send is cut below it, and what is
larger is refused.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from panjoin.client import Client, join_input
from panjoin.generate import generate
from panjoin.launch import start_cluster
from panjoin.pki import make_pki
from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc, worker_pb2, worker_pb2_grpc
from panjoin.reference import reference_join, sort_pairs
from panjoin.security import Security, SecurityError, channel, current, is_loopback, use
from panjoin.semantics import parse_predicate, parse_window

WINDOW, PRED = "count:120,100", "band:2"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """PEM files: ca, cert, key (signed by ca); rogue_ca, rogue_cert, rogue_key; token
    and wrong_token files."""
    d = tmp_path_factory.mktemp("pki")
    files = {}
    for prefix in ("", "rogue_"):
        sec = make_pki(str(d), prefix=prefix, subject=f"{prefix}panjoin test")
        files.update({prefix + "ca": sec.ca, prefix + "cert": sec.cert, prefix + "key": sec.key})
    for name, tok in (("token", "s3cret-0123456789abcdef"), ("wrong_token", "guess"),
                      ("empty_token", "  ")):
        path = d / name
        path.write_text(tok + "\n")
        files[name] = str(path)
    return files


@pytest.fixture(scope="module")
def secure(pki):
    """The cluster's settings: every process has the certificate, the CA, and the
    manager the token file."""
    return Security(pki["cert"], pki["key"], pki["ca"], pki["token"])


@pytest.fixture(scope="module")
def cluster(secure):
    with start_cluster(2, security=secure) as c:
        yield c


@pytest.fixture(scope="module")
def events():
    return generate(1200, "zipf", key_min=0, key_max=50, rate=1000, seed=29)


def _reference(t, window=WINDOW, pred=PRED):
    return reference_join(t.stream, t.id, t.key, t.ts, parse_window(window),
                          parse_predicate(pred)).pairs


def _pairs(res):
    return sort_pairs(np.stack([res.r_id, res.s_id], axis=1))


def _health(address, sec) -> int:
    with channel(address, sec) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=20).status


def _code(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def test_a_join_over_mutual_tls_and_a_token_is_exact(cluster, pki, events):
    with Client(cluster.address, Security(ca=pki["ca"], token_file=pki["token"])) as c:
        res = c.join(events, WINDOW, PRED, "bisort", chunk=300, subwindow_size=40,
                     partitions=4, batch_size=64)
    ref = _reference(events)
    assert len(ref) > 100
    assert np.array_equal(_pairs(res), ref)


def test_a_worker_answers_only_certificates_of_its_ca(cluster, pki):
    w = cluster.addresses[0]
    serving = health_pb2.HealthCheckResponse.SERVING
    assert _health(w, Security(pki["cert"], pki["key"], pki["ca"])) == serving
    with channel(w, Security(pki["cert"], pki["key"], pki["ca"])) as ch:
        st = worker_pb2_grpc.WorkerStub(ch).Status(worker_pb2.StatusRequest(), timeout=20)
    assert st.threads == 1
    for sec in (Security(),  # plaintext
                Security(ca=pki["ca"]),  # TLS, but no client certificate
                Security(pki["rogue_cert"], pki["rogue_key"], pki["ca"]),  # another CA's
                Security(pki["cert"], pki["key"], pki["rogue_ca"])):  # the worker is not ours
        assert _code(lambda s=sec: _health(w, s)) == grpc.StatusCode.UNAVAILABLE
        with channel(w, sec) as ch:
            assert _code(lambda c=ch: worker_pb2_grpc.WorkerStub(c).Status(
                worker_pb2.StatusRequest(), timeout=20)) == grpc.StatusCode.UNAVAILABLE


def test_the_manager_wants_its_token_but_health_stays_open(cluster, pki):
    m = cluster.address
    ca = pki["ca"]
    assert _health(m, Security(ca=ca)) == health_pb2.HealthCheckResponse.SERVING
    for tok in (None, pki["wrong_token"]):
        with Client(m, Security(ca=ca, token_file=tok)) as c:
            assert _code(lambda c=c: c.open(WINDOW, PRED)) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda c=c: c.status("nope")) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(lambda c=c: list(c.stub.Join(iter([manager_pb2.JoinInput(
                join_id="x", batch_id=1)])))) == grpc.StatusCode.UNAUTHENTICATED

    def services(token):
        with channel(m, Security(ca=ca, token_file=token), token=True) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            reply = next(stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=20))
        return {s.name for s in reply.list_services_response.service}

    assert _code(lambda: services(None)) == grpc.StatusCode.UNAUTHENTICATED
    assert "panjoin.v1.Manager" in services(pki["token"])
    # the manager's certificate is checked: a client of another CA never connects
    with Client(m, Security(ca=pki["rogue_ca"], token_file=pki["token"])) as c:
        assert _code(lambda: c.open(WINDOW, PRED)) == grpc.StatusCode.UNAVAILABLE


def test_replay_on_a_secured_manager_from_the_command_line(cluster, pki, events, tmp_path):
    from panjoin.cli.main import main
    from panjoin.events import read_pairs, write_events

    ev = tmp_path / "ev.parquet"
    write_events(events, ev)
    out = tmp_path / "pairs.parquet"
    old = current()
    try:
        args = ["replay", str(ev), "--window", WINDOW, "--predicate", PRED, "--cluster",
                cluster.address, "--out", str(out), "--no-progress", "--tls-ca", pki["ca"]]
        try:  # no token: refused (a gRPC error, or its one-line report)
            rc = main(args)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            rc = 1
        assert rc != 0
        assert main([*args, "--auth-token-file", pki["token"]]) == 0
    finally:
        use(old)
    assert np.array_equal(sort_pairs(read_pairs(out)), _reference(events))


def test_a_handshake_chain_over_mutual_tls_is_exact(secure, pki, events):
    with start_cluster(2, role="handshake-node", manager_args=["--topology", "handshake"],
                       security=secure) as c:
        assert _code(lambda: _health(c.addresses[1], Security(ca=pki["ca"]))) \
            == grpc.StatusCode.UNAVAILABLE
        with Client(c.address, Security(ca=pki["ca"], token_file=pki["token"])) as cl:
            res = cl.join(events, WINDOW, PRED, chunk=300)
    assert np.array_equal(_pairs(res), _reference(events))


def test_the_pipeline_job_takes_the_flags_to_the_manager(pki):
    import argparse

    from panjoin.cli.options import add_join_opts
    from spark_conn.cli import add_pipeline_opts, config_from_args, job_argv
    from spark_conn.config import PipelineConfig

    ap = argparse.ArgumentParser()
    add_pipeline_opts(ap)
    add_join_opts(ap)
    sec = Security(ca=pki["ca"], token_file=pki["token"], max_message_mb=128)
    cfg = PipelineConfig("127.0.0.1:9", "127.0.0.1:8", "ck", "time:500,500", "band:1",
                         security=sec)
    assert "--auth-token-file" in job_argv(cfg)
    assert config_from_args(ap.parse_args(job_argv(cfg))) == cfg


def test_nothing_serves_unprotected_off_loopback(pki):
    tls = (pki["cert"], pki["key"])
    with pytest.raises(SecurityError, match="--tls-cert"):
        Security().check_bind("0.0.0.0", "a worker")
    with pytest.raises(SecurityError, match="--tls-ca"):
        Security(*tls).check_bind("10.0.0.5", "a worker")  # TLS, but anyone may call
    Security(*tls, ca=pki["ca"]).check_bind("0.0.0.0", "a worker")  # mutual TLS
    Security(*tls, token_file=pki["token"]).check_bind("0.0.0.0", "the manager")
    Security(insecure=True).check_bind("0.0.0.0", "a worker")  # said so
    Security().check_bind("127.0.0.1", "a worker")
    assert is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("db1")
    with pytest.raises(SecurityError, match="plaintext"):  # a token is not sent in clear
        channel("10.0.0.5:50050", Security(token_file=pki["token"]), token=True)
    with pytest.raises(SecurityError, match="give both"):
        Security(cert=pki["cert"])
    with pytest.raises(SecurityError, match="empty"):
        Security(token_file=pki["empty_token"])
    with pytest.raises(SecurityError, match="no such file"):
        Security(ca=pki["ca"] + ".gone")
    for cmd in (["worker", "--host", "0.0.0.0", "--port", "0"],
                ["handshake-node", "--host", "0.0.0.0", "--port", "0", "--tls-cert",
                 pki["cert"], "--tls-key", pki["key"]],
                ["manager", "--host", "0.0.0.0", "--port", "0", "--workers", "127.0.0.1:9"]):
        p = subprocess.run([sys.executable, "-m", "panjoin.cli", *cmd], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        assert "off loopback" in p.stderr and "--insecure" in p.stderr, p.stderr


def test_a_second_server_on_a_busy_port_fails(cluster, pki):
    port = cluster.addresses[0].rsplit(":", 1)[1]
    for extra in ([], ["--tls-cert", pki["cert"], "--tls-key", pki["key"], "--tls-ca",
                       pki["ca"]]):
        p = subprocess.run([sys.executable, "-m", "panjoin.cli", "worker", "--port", port,
                            *extra], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "port is in use" in p.stderr, (p.stdout, p.stderr)
        assert "listening" not in p.stdout


# ------------------------------------------------------------------ message limits


@pytest.fixture(scope="module")
def small():
    """One worker and a manager that take messages of at most 1 MiB."""
    with start_cluster(1, security=Security(max_message_mb=1)) as c:
        yield c


def test_a_message_over_the_limit_is_refused_by_the_server(small):
    t = generate(120_000, "uniform", key_min=0, key_max=1000, rate=1000, seed=3)
    big = join_input("x", 1, t)  # 13 bytes a tuple (narrowed columns)
    assert big.ByteSize() > 1 << 20
    opts = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(small.address, options=opts) as ch:
        stub = manager_pb2_grpc.ManagerStub(ch)
        assert _code(lambda: list(stub.Join(iter([big]), timeout=60))) \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
    with grpc.insecure_channel(small.addresses[0], options=opts) as ch:
        stub = health_pb2_grpc.HealthStub(ch)  # any method: the limit is the server's
        req = health_pb2.HealthCheckRequest(service="x" * (2 << 20))
        assert _code(lambda: stub.Check(req, timeout=60)) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_client_and_the_manager_cut_what_they_send_below_the_limit(small):
    # 60K tuples are 1.5 MiB of input as the client counts it (its int64 columns wide,
    # an upper bound), and each tuple has some 20 partners: the client
    # cuts the input into messages of 26K tuples, and the manager each one's answer of
    # some 500K pairs (8 MiB); the join is exact
    t = generate(60_000, "uniform", key_min=0, key_max=20, rate=1000, seed=4)
    window, pred = "count:400,400", "eq"
    with Client(small.address, Security(max_message_mb=1)) as c:
        res = c.join(t, window, pred, "bisort", chunk=1 << 20, batch_size=2048)
        jid = c.open(window, pred)
        with pytest.raises(ValueError, match="over the 1 MiB message limit"):
            list(c.stream(jid, [t]))  # one batch id: cannot be cut, so refused
        session = c.session(jid)
        try:
            with pytest.raises(ValueError, match="--max-message-mb"):
                session.send(1, t)
        finally:
            session.close()
        with c.live(c.open(window, pred)) as live, pytest.raises(ValueError, match="limit"):
            live.push(t)
    ref = _reference(t, window, pred)
    assert len(ref) * 16 > 16 << 20  # 16 bytes a pair: 16 MiB or more
    assert np.array_equal(_pairs(res), ref)


def test_results_past_the_manager_need_the_workers_certificate_check(secure, pki, events):
    """Results past the manager over mutual TLS: a client with a certificate of the
    workers' CA takes the pairs from them; one without (a token and the CA only) cannot
    subscribe, and its join falls back to the manager's path, saying why; exact both."""
    with start_cluster(2, security=secure, manager_args=["--replicas", "1"]) as c:
        for sec, direct in ((Security(pki["cert"], pki["key"], pki["ca"], pki["token"]), True),
                            (Security(ca=pki["ca"], token_file=pki["token"]), False)):
            with Client(c.address, sec) as cl:
                jid = cl.open(WINDOW, PRED, "bisort", subwindow_size=40, batch_size=64,
                              direct_results=True)
                assert (jid in cl.direct) == direct
                if not direct:
                    assert "could not be subscribed" in cl.why_not_direct
                outs = cl.run_join(jid, [events.slice(a, min(len(events), a + 300))
                                         for a in range(0, len(events), 300)])
            r = np.concatenate([o.r_id for o in outs])
            s = np.concatenate([o.s_id for o in outs])
            assert np.array_equal(sort_pairs(np.stack([r, s], axis=1)), _reference(events))
