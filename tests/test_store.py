"""The subwindow store (index + ids), its backup log and promotion, and the codec's examples."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import panjoin.backend as backend_mod
import panjoin.codec as codec_mod
import panjoin.subwindow.store as store_mod
from panjoin.subwindow import WindowFilter
from panjoin.subwindow.store import SubwindowStore


@pytest.mark.parametrize("mod", [store_mod, backend_mod, codec_mod])
def test_doctests(mod):
    assert doctest.testmod(mod).failed == 0


def _batches(rng, n_batches=6, size=40, start=100):
    seq = start
    for _ in range(n_batches):
        keys = np.sort(rng.integers(-50, 50, size)).astype(np.int64)
        seqs = rng.permutation(np.arange(seq, seq + size)).astype(np.int64)
        yield keys, rng.integers(0, 1000, size).astype(np.int64), seqs, seqs * 10 + 7
        seq += size


def _pairs(pidx, ids):
    return sorted(zip(pidx.tolist(), ids.tolist(), strict=True))


@pytest.mark.parametrize("kind", ["rap", "wib", "bisort", "nested"])
def test_a_promoted_backup_answers_like_the_primary_and_seq_limits_cut_exactly(kind):
    rng = np.random.default_rng(7)
    primary = SubwindowStore(kind, 240, "int64", 4)
    backup = SubwindowStore(kind, 240, "int64", 4, backup=True)
    all_keys, all_ids = [], []
    for keys, ts, seq, ids in _batches(rng):
        primary.insert(keys, ts, seq, ids)
        backup.insert(keys, ts, seq, ids)
        all_keys.append(keys)
        all_ids.append(ids)
    all_keys, all_ids = np.concatenate(all_keys), np.concatenate(all_ids)
    primary.check()
    backup.check()
    assert backup.backup and len(backup) == len(primary) == 240
    with pytest.raises(ValueError, match="promote"):
        backup.probe(np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64),
                     WindowFilter.none(1))
    backup.promote()
    backup.check()
    probe = np.sort(rng.integers(-55, 55, 64)).astype(np.int64)
    lo, hi = (probe - 3)[None, :], (probe + 3)[None, :]
    flt = WindowFilter.none(64)
    p_idx, p_ids, p_seq = primary.probe(lo, hi, flt)
    b_idx, b_ids, _ = backup.probe(lo, hi, flt)
    assert len(p_idx) > 0
    assert _pairs(p_idx, p_ids) == _pairs(b_idx, b_ids)
    assert np.array_equal(p_ids, p_seq * 10 + 7)  # each pair answers its tuple's id
    # brute force: every stored key within 3 of the probe key
    i, j = np.nonzero(np.abs(probe[:, None] - all_keys[None, :]) <= 3)
    assert _pairs(p_idx, p_ids) == _pairs(i, all_ids[j])
    for limit in (100, 160, 223, 340):
        got_idx, got_ids, _ = backup.probe(lo, hi, flt, seq_limit=limit)
        keep = p_seq < limit
        assert _pairs(got_idx, got_ids) == _pairs(p_idx[keep], p_ids[keep])


def test_inserts_that_break_the_run_or_overflow_are_refused():
    st = SubwindowStore("nested", 4, "int64", 1)
    k = np.array([1, 2], np.int64)
    st.insert(k, k, np.array([5, 6]), np.array([50, 60]))
    with pytest.raises(ValueError, match="continue"):
        st.insert(k, k, np.array([9, 10]), np.array([1, 2]))
    with pytest.raises(ValueError, match="overflows"):
        st.insert(np.arange(3), np.arange(3), np.arange(7, 10), np.arange(3))
    with pytest.raises(ValueError, match="differ"):
        st.insert(k, k, np.array([7]), np.array([1, 2]))
    st.check()
    assert len(st) == 2
