"""What a peer's run yields, and the check that the peers found the same pairs.

A :class:`PeerResult` is one row of the benchmark (a peer on a workload at one
W). Its result is the *set* of (r_id, s_id) pairs the peer found, kept as its
count and :class:`~panjoin.bench.peers.digest.PairDigest` fingerprint because a
large run finds billions of pairs. :func:`check_results` compares the digests of
every peer that ran the same tuples, so a peer that finds the right number of
pairs but a wrong pair fails the run, not only one that finds too many or too few.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PeerResult:
    workload: str
    window: int
    peer: str
    status: str = "ok"  # ok | bounded | extrapolated | skipped | failed
    note: str = ""
    results: int | None = None  # number of (r_id, s_id) pairs found
    steady_tps: float | None = None
    whole_tps: float | None = None
    seconds: float | None = None
    memory_bytes: int | None = None
    # PairDigest.hex() of the pairs found; None for a peer that reports only a count
    # (Spark's hook) or found nothing it ran (skipped, extrapolated, failed)
    pair_digest: str | None = None


def check_results(records: list[PeerResult]) -> list[str]:
    """Every peer that ran the whole file of a workload found the same pairs: the same
    count and, among the peers that fingerprint their pairs (all but a count-only peer),
    the same pair digest; so did every peer that ran it bounded (the same probe tuples).
    One message per disagreeing group; none when all agree."""
    problems = []
    groups: dict[tuple, dict[str, PeerResult]] = {}
    for r in records:
        if r.status in ("ok", "bounded") and r.results is not None:
            groups.setdefault((r.workload, r.window, r.status), {})[r.peer] = r
    for (wl, w, st), recs in groups.items():
        what = " (bounded runs)" if st == "bounded" else ""
        counts = {p: r.results for p, r in recs.items()}
        digests = {p: r.pair_digest for p, r in recs.items() if r.pair_digest is not None}
        if len(set(counts.values())) > 1:
            problems.append(f"{wl} W={w}: result counts differ{what}: {counts}")
        elif len(set(digests.values())) > 1:
            problems.append(f"{wl} W={w}: result pairs differ{what} (same count "
                            f"{next(iter(counts.values()))}), pair digests: {digests}")
    return problems
