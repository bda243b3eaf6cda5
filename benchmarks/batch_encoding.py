"""A batch's cost on the wire, per batch: the manager's encoding plus one outgoing
Commands message per worker, and one worker's parse and decode (issue 28, item 2).

The manager sends each batch once to every worker that probes or inserts it (3-4 of
them at N = 4 on an equi join of W = 1M); this times exactly that path, in CPU time
(``time.process_time``, which a loaded machine stretches less than wall time), on a
256K-tuple batch shaped like ``benchmarks.scale_out``'s eq-1M (NBat 256K, keys in
[0, 1M], consecutive seqs, opposite-arrival counts). Run it in two trees for an A/B::

    PYTHONPATH=. python -m benchmarks.batch_encoding [--workers 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from panjoin import codec
from panjoin.backend import SortedBatch
from panjoin.proto.panjoin.v1 import worker_pb2
from panjoin.wire import Encoded

NBAT = 1 << 18


def eq_batch(n: int = NBAT, seed: int = 1) -> SortedBatch:
    rng = np.random.default_rng(seed)
    key = rng.integers(0, 1 << 20, n)
    opp = np.sort(rng.integers(3_000_000, 3_000_000 + n, n))
    order = np.argsort(key, kind="stable")
    return SortedBatch.of(9, "R", key[order], opp[order], 2_000_000 + order,
                          4_000_000 + 2 * order, predicate="eq",
                          window="count:1048576,1048576")


def manager_side(b: SortedBatch, workers: int) -> list[bytes]:
    """What the gRPC backend does per batch: encode once, then per worker the Batch
    command wrapped in its session's Commands message, joined into one bytes."""
    enc = codec.encode_batch(b)
    outs = []
    for w in range(workers):
        msg = enc.copy().message(worker_pb2.Batch(release_below=b.batch_id))
        cmd = msg.wrap(worker_pb2.Command, "batch",
                       worker_pb2.Command(command_id=w + 1).SerializeToString())
        outs.append(Encoded(worker_pb2.Commands).extend(
            cmd.wrap(worker_pb2.Commands, "commands")).tobytes())
    return outs


def worker_side(raw: bytes) -> SortedBatch:
    return codec.decode_batch(worker_pb2.Commands.FromString(raw).commands[0].batch)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    b = eq_batch()
    m, w = [], []
    for _ in range(args.rounds):
        t = time.process_time()
        outs = manager_side(b, args.workers)
        m.append(time.process_time() - t)
        t = time.process_time()
        got = worker_side(outs[0])
        w.append(time.process_time() - t)
    for g, want in zip(got.columns()[:4], b.columns()[:4], strict=True):
        assert np.array_equal(g, want)  # the worker gets the batch the manager sent
    print(json.dumps({"bytes_per_tuple_per_worker": round(len(outs[0]) / NBAT, 2),
                      f"manager_ms_per_batch_N{args.workers}": round(1e3 * float(np.median(m)), 2),
                      "worker_ms_per_batch": round(1e3 * float(np.median(w)), 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
