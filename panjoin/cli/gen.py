"""``panjoin gen``: write a generated stream pair (uniform, Zipf, increasing, normal or
all-equal keys; optional payload and key2) as an event file.

    panjoin gen events.parquet --n 2M --dist zipf
"""

from __future__ import annotations

import time

from panjoin.cli.options import add_common, size


def add_parser(sub) -> None:
    p = sub.add_parser("gen", help="generate an event file",
                       description="Write a generated stream pair as an event file.")
    p.add_argument("out", help="output file (.parquet or .csv)")
    p.add_argument("--n", type=size, default=1 << 20, help="tuples in all (default: 1M)")
    p.add_argument("--dist", default="uniform",
                   choices=["uniform", "zipf", "increasing", "normal", "equal"],
                   help="key distribution (default: %(default)s)")
    p.add_argument("--key-min", type=int, default=0)
    p.add_argument("--key-max", type=int, default=1_000_000)
    p.add_argument("--float-keys", action="store_true", help="float64 keys")
    p.add_argument("--rate", type=float, default=1e6, help="tuples per second (sets ts)")
    p.add_argument("--disorder-ms", type=int, default=0, help="max ts delay of late-ish tuples")
    p.add_argument("--r-fraction", type=float, default=0.5, help="share of R tuples")
    p.add_argument("--zipf-a", type=float, default=1.2)
    p.add_argument("--modes", type=int, default=4, help="peaks of the 'normal' distribution")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--payload", action="store_true", help="add a string payload column")
    p.add_argument("--key2-max", type=float, default=None, metavar="M",
                   help="add a second attribute key2, uniform in [0, M), for residual "
                        "predicates such as band:10&band2:10")
    add_common(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from panjoin.events import write_events
    from panjoin.generate import generate

    t0 = time.perf_counter()
    table = generate(args.n, args.dist, key_min=args.key_min, key_max=args.key_max,
                     float_keys=args.float_keys, rate=args.rate, disorder_ms=args.disorder_ms,
                     r_fraction=args.r_fraction, zipf_a=args.zipf_a, modes=args.modes,
                     seed=args.seed, payload=args.payload, key2_max=args.key2_max)
    write_events(table, args.out)
    nr, ns = table.counts()
    print(f"wrote {len(table)} events ({nr} R, {ns} S, {args.dist} keys) to {args.out} "
          f"in {time.perf_counter() - t0:.2f} s")
    return 0
