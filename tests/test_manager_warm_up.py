"""The manager's start (``panjoin manager``): its own kernels are loaded before its
first join, over a null backend that holds and finds nothing and expires like any."""

from __future__ import annotations

import os
import subprocess
import sys

from panjoin.backend import NullBackend
from panjoin.generate import generate
from panjoin.manager.engine import JoinEngine


def test_a_null_backend_expires_its_subwindows():
    # a null worker (panjoin worker --null) once failed at the first expiry
    t = generate(5000, "uniform", key_min=0, key_max=50, seed=2)
    eng = JoinEngine("count:1K,1K", "eq", index="nested", batch_size=256,
                     subwindow_size=256, backend=NullBackend())
    eng.push(t)
    eng.flush()
    r, s = eng.take_results()
    assert r.size == 0 and eng.backend.stats.expires > 0
    assert set(eng.backend.subs) == {sub.sub_id for x in "RS" for sub in eng.rings[x]}


def test_warm_up_loads_the_managers_kernels_for_int_and_float_keys():
    # in a fresh process: here other tests have loaded them already
    code = ("from panjoin.manager import kernels\n"
            "from panjoin.manager.engine import warm_up_manager\n"
            "warm_up_manager()\n"
            "from panjoin import key_sort_kernels as ks, sharding_kernels as sk\n"
            "print(sorted({str(s[1]) for s in kernels.split_into.signatures}),"
            " len(ks.pack_rows.signatures), len(ks.unpack_rows.signatures),"
            " len({str(s[1]) for s in sk.route_eq_rows.signatures}),"
            " len({str(s[1]) for s in sk.route_rows.signatures}))")
    # Numba's kernels (the build compiled ahead of time would take the int64 calls)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PANJOIN_AOT": "0"})
    assert p.returncode == 0, p.stderr
    keys, packs, unpacks, eq_routes, routes = p.stdout.rsplit(" ", 4)
    assert "int64" in keys and "float64" in keys and int(packs) and int(unpacks)
    # key placement's router, for int and float keys
    assert int(eq_routes) == int(routes) == 2
