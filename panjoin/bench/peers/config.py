"""What one run of the peer benchmark is asked to do: :class:`PeerConfig`.

Window sizes, selectivities, the peers, the limits beyond which the scanning peers
run bounded or are extrapolated, the time budget, threads and repeats; and
:meth:`PeerConfig.workloads`, the grid of workloads these give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from panjoin.bench.peers.workloads import Workload


@dataclass
class PeerConfig:
    windows: list[int] = field(default_factory=lambda: [1 << 16, 1 << 18, 1 << 20, 1 << 23])
    measure: int | None = None  # M; default W
    selectivities: tuple = (1, 64, 1024)
    nested_max: int = 1 << 14  # nested loop, SHJ and duckdb-range on band joins, in full
    sorted_max: int = 1 << 16
    bounded_probes: int = 1 << 13  # beyond a peer's limit: this many probe tuples, full windows
    bounded_max: int = 1 << 23  # no bounded run above this W (the fill alone is 2W inserts)
    band2d_max: int = 1 << 18  # 2-D: every x-band candidate becomes a pair (21 W / 10^4 each)
    budget_s: float = 120.0  # a peer slower than this at one window skips the larger ones
    repeat: int = 2  # interleaved rounds per workload; each peer's best round counts
    # one thread per peer: on the shared 2-core box (load 4-6) two Numba threads meet at
    # OpenMP barriers and ran PanJoin 2.5x slower than one; DuckDB ran alike with 1 or 2.
    # Polars' pool is sized at import (run_peers sets POLARS_MAX_THREADS to this);
    # DataFusion gets this many target partitions (polars-mt and datafusion-mt: their
    # engine's default threads, whatever this says)
    threads: int = 1
    # the offline engines in a child process of their own (see runner.offline_pool)
    isolate: bool = True
    workers: int = 2
    chunk: int = 1 << 16
    seed: int = 0
    only: tuple = ()  # keep only the workloads with these names (e.g. "band S=64 uniform")
    peers: tuple = ("panjoin-rap", "panjoin-wib", "panjoin-bisort", "panjoin-cluster",
                    "nested-loop", "sorted-list", "shj", "duckdb", "duckdb-range", "polars",
                    "polars-mt", "datafusion", "datafusion-mt", "spark")

    @classmethod
    def quick(cls) -> PeerConfig:
        """Every peer on every workload kind once, W = 8K (a bounded run of the scans
        included, at 16K for band S=64 uniform): about 2-3 minutes on 2 cores."""
        return cls(windows=[1 << 13], extra_windows=((1 << 14, "band S=64 uniform"),),
                   nested_max=1 << 13, sorted_max=1 << 13, bounded_probes=1 << 11,
                   budget_s=30.0, chunk=1 << 12, repeat=1)

    extra_windows: tuple = ()  # (W, workload name) pairs run besides the windows

    def workloads(self) -> list[Workload]:
        out = []
        for w in self.windows:
            out += [Workload("band", s, "uniform", w) for s in self.selectivities]
            out += [Workload("eq", 1, "uniform", w), Workload("eq", 1, "zipf", w),
                    Workload("band", 64, "zipf", w), Workload("band", 64, "increasing", w),
                    Workload("band", 64, "uniform", w, "time")]
            if w <= self.band2d_max:
                out.append(Workload("band2d", 0, "uniform", w))
        for w, name in self.extra_windows:
            out += [wl for wl in _all_workloads(w) if wl.name == name]
        if self.only:
            known = sorted({wl.name for wl in out})
            bad = [o for o in self.only if o not in known]
            if bad:
                raise ValueError(f"unknown workload(s) {bad}; choose from {known}")
            out = [wl for wl in out if wl.name in self.only]
        return out


def _all_workloads(w: int) -> list[Workload]:
    """Every workload kind at one W."""
    return PeerConfig(windows=[w], band2d_max=w).workloads()
