"""What a JoinOutput of n pairs costs the manager to put on the wire (issue 28).

Three ways, per pair, over messages of 2M, 256K, 128K and 64K pairs: building the
generated message (``to_array`` then ``CopyFrom``) and serialising it, as the manager
did; and writing it straight into protobuf's wire format
(:func:`panjoin.manager.service.encode_output`), as it does now. Large messages are
built in freshly mapped memory, whose page faults cost more than the copy; the encoded
form copies each pair once. Runs alternate, each timed over the same number of pairs::

    python -m benchmarks.output_encoding          # [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from panjoin.manager.service import encode_output
from panjoin.proto.panjoin.v1 import manager_pb2
from panjoin.wire import to_array


def built(r, s) -> bytes:
    o = manager_pb2.JoinOutput(batch_id=0, pushed=True)
    o.r_id.CopyFrom(to_array(r))
    o.s_id.CopyFrom(to_array(s))
    return o.SerializeToString()


def encoded(r, s) -> bytes:
    return encode_output(0, True, r, s).tobytes()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs (a CI smoke run)")
    args = ap.parse_args(argv)
    total = (1 << 22) if args.quick else (1 << 24)
    print("| pairs per message | built + serialised | encoded |")
    print("|---:|---:|---:|")
    for n in (2 << 20, 256 << 10, 128 << 10, 64 << 10):
        r = np.arange(n, dtype=np.int64)
        s = r + 1
        assert manager_pb2.JoinOutput.FromString(built(r, s)) == \
            manager_pb2.JoinOutput.FromString(encoded(r, s))
        reps = max(1, total // n)
        best = {}
        for f in (built, encoded, built, encoded):
            t = time.perf_counter()
            for _ in range(reps):
                f(r, s)
            ns = (time.perf_counter() - t) / reps / n * 1e9
            best[f.__name__] = min(best.get(f.__name__, ns), ns)
        print(f"| {n:,} | {best['built']:.1f} ns/pair | {best['encoded']:.1f} ns/pair |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
