"""The limits a join must fit in, checked before anything is allocated (issue 29).

Two kinds, both asked at ``Open`` by the manager, before it connects to a worker:

- **Ranges** (:func:`check_open`): every number of an ``OpenRequest`` is within what
  the engine and the workers can hold (0 stays "the default"); a bad one is
  INVALID_ARGUMENT with the range, e.g. ``partitions = -5`` or ``max_lag = -5``, a
  NaN deadline, ``key_dtype = "float32"``, or ``count:10^30``.
- **Memory** (:func:`subwindow_bytes`, :func:`join_bytes_per_worker`): what a full
  subwindow holds, by index kind, from its capacity NSub and partition count P (the
  constants were measured on full subwindows of 64K tuples, int64 keys, ids
  included); a join's subwindows spread over the workers. A worker has a budget
  (``panjoin worker --memory-limit``, default :func:`default_memory_limit`, which
  follows the cgroup's memory limit, :mod:`panjoin.memory`), tells it
  to each new session, and reserves each subwindow's bytes at Create: a join or a
  subwindow that does not fit is RESOURCE_EXHAUSTED, naming the numbers.

A handshake chain node checks each ``ChainConfig`` the same way
(:func:`check_chain_config`) before it builds anything: chain length, result FIFO and
message sizes within the caps below, and its neighbours' addresses given.

Example: ``count:1M,1M``, NSub 256K, BI-Sort (P 32K), 2 workers, 2 replicas. A stream
holds at most ceil(1M / 256K) + 1 = 5 subwindows (the oldest expiring, the newest
filling), so 10 in all; a subwindow takes 256K x 40 + 32K x 16 = 11 MB, its backup
256K x 48 = 12.6 MB; each worker holds 5 primaries and 5 backups: about 118 MB.
"""

from __future__ import annotations

import math

from panjoin.config import INDEX_CHOICES
from panjoin.memory import fmt_bytes, memory_budget
from panjoin.semantics import Window

#: the largest count window (tuples a stream), subwindow (NSub), partition count (P),
#: batch (NBat) and lag an Open may ask for: far above any host, far below overflow
MAX_WINDOW = 1 << 40
MAX_SUBWINDOW = 1 << 32
MAX_PARTITIONS = 1 << 20
MAX_BATCH = 1 << 24
MAX_LAG = 1 << 40
#: most tuples in one JoinInput: more must be split (each costs the manager some 150
#: bytes while it is collected and sorted; 10M in one message took 1.4 GB)
MAX_INPUT_TUPLES = 1 << 22
KEY_DTYPES = ("", "int64", "float64")

#: a handshake chain: most nodes, pairs in a node's result FIFO (16 bytes each), tuples in
#: one forwarded message (about 48 bytes each on the wire: within the message limit),
#: characters in a chain id and in a neighbour's address
MAX_CHAIN_NODES = 1 << 10
MAX_RESULT_FIFO = 1 << 24
MAX_CHAIN_MESSAGE = 1 << 20
MAX_CHAIN_ID = 128
MAX_ADDRESS = 256

#: bytes a full subwindow holds per tuple and per partition, by index kind
#: (auto: the most its choices, hash and BI-Sort, may hold)
PER_TUPLE = {"auto": 96, "rap": 72, "wib": 184, "bisort": 40, "bisort-opencl": 40, "hash": 96,
             "nested": 32, "sortedlist": 176}
PER_PARTITION = {"auto": 16, "rap": 144, "wib": 176, "bisort": 16, "bisort-opencl": 16, "hash": 0,
                 "nested": 0, "sortedlist": 0}
#: a backup logs its inserts (key, ts, seq, id and key2) and builds no index
BACKUP_PER_TUPLE = 48
#: the default worker budget: this share of the host's available memory at start
MEMORY_SHARE = 0.8
#: what a worker holds beyond its subwindows, kept out of its default budget: the
#: batches in flight (the manager keeps up to 8 probe rounds in flight; at NBat 256K a
#: batch is some 16 MB as its message and its arrays) and a merge's new main array.
#: Measured (one worker, NBat 256K, RSS from its warm state): +288 MB for subwindows
#: estimated at 126 MB (W 1M), +356 MB for 222 MB (W 1.77M; OOM-killed in a 512 MiB
#: host when this was 128 MiB): about 160 MB beyond the estimate, whatever W
WORKER_IN_FLIGHT = 192 << 20


def check_open(req) -> None:
    """Range-check an OpenRequest's numbers (window and predicate are parsed by the
    caller); raises ValueError saying which field and its range."""
    if req.index and req.index not in INDEX_CHOICES:
        raise ValueError(f"unknown index {req.index!r}; choose one of {', '.join(INDEX_CHOICES)}")
    if req.key_dtype not in KEY_DTYPES:
        raise ValueError(f"key_dtype must be 'int64' or 'float64' (or empty: taken from the "
                         f"first batch), not {req.key_dtype!r}")
    for name, top in (("subwindow_size", MAX_SUBWINDOW), ("partitions", MAX_PARTITIONS),
                      ("batch_size", MAX_BATCH), ("max_lag", MAX_LAG)):
        v = getattr(req, name)
        if not 0 <= v <= top:
            raise ValueError(f"{name} must be between 1 and {top} (0: the default), got {v}")
    if req.partitions and req.subwindow_size and req.partitions > req.subwindow_size:
        raise ValueError(f"partitions ({req.partitions}) must not exceed subwindow_size "
                         f"({req.subwindow_size}): a partition holds at least one tuple")
    if not (math.isfinite(req.max_collect_ms) and req.max_collect_ms >= 0):
        raise ValueError(f"max_collect_ms must be a finite number >= 0 (0: never), got "
                         f"{req.max_collect_ms}")
    if not math.isfinite(req.max_latency_ms):
        raise ValueError(f"max_latency_ms must be finite (> 0: the bound, 0: the manager's "
                         f"default, < 0: none), got {req.max_latency_ms}")
    if req.result_format not in (0, 1):
        raise ValueError(f"unknown result_format {req.result_format}; 0 (pairs) or 1 (ranges)")


def check_chain_sizes(n_nodes: int, result_fifo: int, max_batch: int) -> None:
    """A handshake chain's sizes within range (the driver's settings, a node's config);
    raises ValueError naming the field and its range."""
    for name, v, top in (("n_nodes", n_nodes, MAX_CHAIN_NODES),
                         ("result_fifo", result_fifo, MAX_RESULT_FIFO),
                         ("max_batch", max_batch, MAX_CHAIN_MESSAGE)):
        if not 1 <= v <= top:
            raise ValueError(f"{name} must be between 1 and {top}, got {v}")


def check_chain_config(cfg) -> None:
    """Range-check a ``ChainConfig`` before the node allocates anything for it (window,
    predicate, key dtype and segment index are parsed by the node)."""
    if not 1 <= len(cfg.chain_id) <= MAX_CHAIN_ID:
        raise ValueError(f"chain_id must have 1 to {MAX_CHAIN_ID} characters, got "
                         f"{len(cfg.chain_id)}")
    check_chain_sizes(cfg.n_nodes, cfg.result_fifo, cfg.max_batch)
    if not 0 <= cfg.position < cfg.n_nodes:
        raise ValueError(f"position {cfg.position} outside 0..{cfg.n_nodes - 1}")
    for name, address, needed in (("left", cfg.left, cfg.position > 0),
                                  ("right", cfg.right, cfg.position < cfg.n_nodes - 1)):
        if len(address) > MAX_ADDRESS:
            raise ValueError(f"{name} must be a host:port of at most {MAX_ADDRESS} characters")
        if needed and not address:
            raise ValueError(f"{name} must be the {name} neighbour's host:port at position "
                             f"{cfg.position} of {cfg.n_nodes}")


def check_window(window: Window) -> None:
    """A count window of at most MAX_WINDOW tuples a stream (time windows: any span)."""
    if window.kind == "count" and max(window.r, window.s) > MAX_WINDOW:
        raise ValueError(f"count window {window.r},{window.s} is above {MAX_WINDOW} tuples a "
                         "stream; no host holds that")


def check_sizes(nsub: int, partitions: int) -> None:
    """The effective NSub and P (defaults filled in) within range."""
    if not 1 <= nsub <= MAX_SUBWINDOW:
        raise ValueError(f"subwindow size {nsub} is outside 1..{MAX_SUBWINDOW}; give a "
                         "smaller subwindow_size")
    if not 1 <= partitions <= min(nsub, MAX_PARTITIONS):
        raise ValueError(f"partitions {partitions} is outside 1..{min(nsub, MAX_PARTITIONS)} "
                         f"(at most the subwindow size {nsub} and {MAX_PARTITIONS})")


def subwindow_bytes(kind: str, capacity: int, partitions: int, backup: bool = False) -> int:
    """Bytes a full subwindow of ``kind`` holds (a backup: its insert log)."""
    if backup:
        return BACKUP_PER_TUPLE * capacity
    return PER_TUPLE.get(kind, 200) * capacity + PER_PARTITION.get(kind, 200) * partitions


def join_bytes_per_worker(window: Window, nsub: int, partitions: int, kind: str,
                          n_workers: int, replicas: int) -> int:
    """Bytes the busiest worker holds for a join once its window is full. A count window
    of W keeps ceil(W / NSub) + 1 subwindows a stream; a time window at least 2 (it
    grows with the data: each worker checks every Create against its budget)."""
    if window.kind == "count":
        subs = sum(math.ceil(w / nsub) + 1 for w in (window.r, window.s))
    else:
        subs = 4
    mine = math.ceil(subs / n_workers)
    total = mine * subwindow_bytes(kind, nsub, partitions)
    if replicas > 1 and n_workers > 1:
        total += mine * subwindow_bytes(kind, nsub, partitions, backup=True)
    return total


class WindowTooLarge(ValueError):
    """A join's window does not fit in this process's memory budget (the in-process
    engine's refusal, before it starts: not an OOM kill halfway)."""


def engine_bytes(window: Window, nsub: int, partitions: int, kind: str,
                 window_tuples: int | None = None) -> int | None:
    """Bytes the in-process engine's subwindows hold once the window is full: the
    workers' per-join estimate (:func:`join_bytes_per_worker`) with one worker, by
    ``window_tuples``, the most tuples it will hold per stream (a time window's from the
    input's rate; a count window's never more than its input has: a window of 2^40
    over a small file is small). None when that is unknown (an engine fed by a
    stream of unknown length): the engine then checks each new subwindow. One more
    subwindow on top: a BI-Sort merge builds its new main array beside the old one,
    and the batches in flight and their results need room too."""
    one = subwindow_bytes(kind, nsub, partitions)
    if window_tuples is None:
        return None
    if window.kind == "time":
        return (2 * (math.ceil(window_tuples / nsub) + 1) + 1) * one
    held = Window("count", min(window.r, window_tuples), min(window.s, window_tuples))
    return join_bytes_per_worker(held, nsub, partitions, kind, 1, 1) + one


def check_engine_memory(need: int, budget: int, what: str) -> None:
    """Refuse ``need`` bytes over ``budget`` with the numbers and the ways out."""
    if need > budget:
        raise WindowTooLarge(
            f"{what} needs about {fmt_bytes(need)} for its subwindows, and this process may use "
            f"{fmt_bytes(budget)} (--memory-limit; default {MEMORY_SHARE:.0%} of what is left of "
            "the host's MemAvailable or of its cgroup's memory limit): use a smaller window "
            "or subwindow size, run it on a cluster of more workers (--workers N, "
            "--cluster HOST:PORT), or give a larger --memory-limit")


def default_memory_limit(in_flight: int = 0) -> int:
    """MEMORY_SHARE of what this process may still use (:func:`panjoin.memory.memory_budget`:
    the host's MemAvailable, or less where its cgroup's memory limit leaves less), less
    ``in_flight`` bytes it needs beside its subwindows (a worker: WORKER_IN_FLIGHT): a
    worker's budget when ``--memory-limit`` is not given, and the in-process engine's."""
    return int(max(0, memory_budget().left - in_flight) * MEMORY_SHARE)
