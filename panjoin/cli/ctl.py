"""``panjoin ctl``: change a running manager. Today: its workers, while joins run
(:mod:`panjoin.manager.resize`). Exits 0 once the change is in effect (new subwindows
go to the added worker, none to the removed one), 1 with the manager's one-line reason
otherwise.

    panjoin ctl --manager 127.0.0.1:50050 add-worker 127.0.0.1:50053
    panjoin ctl --manager m:50050 --tls-ca ca.pem --auth-token-file T remove-worker w1:50051
"""

from __future__ import annotations

from panjoin.cli.options import add_common, add_security


def add_parser(sub) -> None:
    p = sub.add_parser("ctl", help="change a running manager: add or remove workers",
                       description="Add a worker to a running manager, or remove one, "
                                   "while its joins run.")
    p.add_argument("--manager", required=True, metavar="HOST:PORT",
                   help="the manager's address")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="give up after S seconds (default: %(default)s)")
    add_security(p, "client")
    add_common(p)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, what in (("add-worker", "new subwindows go to it from the next batch on"),
                       ("remove-worker", "no new subwindows go to it; it is released once "
                                         "its subwindows expired")):
        a = actions.add_parser(name, help=what, description=f"{name}: {what}.")
        a.add_argument("address", metavar="HOST:PORT", help="the worker's address")
        a.set_defaults(run=run)


def run(args) -> int:
    from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
    from panjoin.security import channel

    with channel(args.manager, token=True) as ch:
        stub = manager_pb2_grpc.ManagerStub(ch)
        rpc = stub.AddWorker if args.action == "add-worker" else stub.RemoveWorker
        reply = rpc(manager_pb2.WorkerRef(address=args.address), timeout=args.timeout)
    done = "added" if args.action == "add-worker" else "removed"
    print(f"worker {args.address} {done}; {reply.joins} open joins changed; workers now: "
          f"{', '.join(reply.workers)}")
    return 0
