"""``panjoin status HOST:PORT``: the manager's ClusterStatus as a table in the terminal,
once or refreshed every S seconds (``--watch S``, the screen cleared each time, as
``watch`` does). It follows the security flags and sends the manager's token.

    $ panjoin status 127.0.0.1:50050
    manager 127.0.0.1:50050 (ring), 1 join open, 2 workers
    JOIN          WINDOW          TUPLES IN  PAIRS  LATE  SUBWINDOWS R/S  WORKERS  MEMORY
    3f2a9c1b0d4e  time:1000,1000       4000   5123    12            2/2      2/2  1.2 MiB
    WORKER           SUBWINDOWS  TUPLES    BYTES     SESSIONS
    127.0.0.1:50051           4    1874    612.0 KiB        1
    127.0.0.1:50052           4    1874    612.0 KiB        1
"""

from __future__ import annotations

import sys
import time

from panjoin.cli.options import add_common, add_security
from panjoin.memory import fmt_bytes


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="show a running manager's joins and workers",
                       description="Ask the manager at HOST:PORT for its open joins and its "
                                   "workers (ClusterStatus) and print them as a table.")
    p.add_argument("manager", metavar="HOST:PORT", help="the manager's address")
    p.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="S",
                   help="refresh every S seconds (default 2) until Ctrl-C")
    add_security(p, "client")
    add_common(p)
    p.set_defaults(run=run)


def table(rows: list[list[str]]) -> list[str]:
    """Rows as lines of left-aligned columns (numbers right-aligned).

    >>> table([["A", "N"], ["x", "10"], ["yy", "2"]])
    ['A    N', 'x   10', 'yy   2']
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    # a column of numbers (and sizes, "2/2") is right-aligned, its header too
    right = [i > 0 and len(rows) > 1 and all(r[i][:1].isdigit() or r[i] == "-" for r in rows[1:])
             for i in range(len(widths))]
    return ["  ".join(c.rjust(w) if ra else c.ljust(w)
                      for c, w, ra in zip(r, widths, right, strict=True)).rstrip()
            for r in rows]


def render(address: str, reply) -> str:
    """The table of a ClusterStatusReply."""
    n_alive = sum(1 for w in reply.workers if w.reachable)
    lines = [f"manager {address} ({reply.topology}), {len(reply.joins)} join"
             f"{'' if len(reply.joins) == 1 else 's'} open, {n_alive}/{len(reply.workers)} "
             "workers reachable"]
    if reply.joins:
        rows = [["JOIN", "WINDOW", "TUPLES IN", "PAIRS", "LATE", "SUBWINDOWS R/S",
                 "WORKERS", "MEMORY"]]
        for j in reply.joins:
            st = j.status
            rows.append([st.join_id, j.settings.window, str(st.tuples_in), str(st.results),
                         str(st.late), f"{st.subwindows_r}/{st.subwindows_s}",
                         f"{st.workers_alive}/{len(reply.workers)}",
                         fmt_bytes(st.memory_bytes)])
        lines += table(rows)
    rows = [["WORKER", "SUBWINDOWS", "TUPLES", "BYTES", "SESSIONS"]]
    for w in reply.workers:
        if not w.reachable:
            rows.append([w.address, "-", "-", "-", "-"])
            continue
        st = w.status
        rows.append([w.address, str(st.subwindows), str(st.tuples), fmt_bytes(st.nbytes),
                     str(st.sessions)])
    lines += table(rows)
    for w in reply.workers:
        if not w.reachable and w.error:
            lines.append(f"{w.address}: unreachable: {w.error}")
    return "\n".join(lines)


def fetch(address: str, timeout: float = 30.0):
    from panjoin.proto.panjoin.v1 import manager_pb2, manager_pb2_grpc
    from panjoin.security import channel

    with channel(address, token=True) as ch:
        return manager_pb2_grpc.ManagerStub(ch).ClusterStatus(
            manager_pb2.ClusterStatusRequest(), timeout=timeout)


def run(args) -> int:
    if args.watch is not None and not args.watch > 0:
        raise ValueError(f"--watch takes a positive number of seconds, got {args.watch}")
    while True:
        text = render(args.manager, fetch(args.manager))
        if args.watch is None:
            print(text, flush=True)
            return 0
        # clear the screen and go home (ANSI), as `watch` does; then the time, the table
        sys.stdout.write("\x1b[2J\x1b[H" + f"every {args.watch:g} s: "
                         f"{time.strftime('%H:%M:%S')}\n\n" + text + "\n")
        sys.stdout.flush()
        time.sleep(args.watch)
