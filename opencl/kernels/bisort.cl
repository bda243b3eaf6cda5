/* BI-Sort on an OpenCL device: the insertion engine and the probing engine of the
 * PanJoin paper's FPGA design (section IV, Figures 7-9).
 *
 * Built once per (device, key type) with -DKEY_T=long or -DKEY_T=double
 * (plus -DKEY_IS_DOUBLE). Every column is a flat __global array; the main array
 * (mk, mt, ms: key, ts, seq) lives in device memory between commands. Layouts
 * and results are the same as the Numba BI-Sort's (panjoin/subwindow/kernels/
 * bisort.py), row for row, so a mirror replaying the inserts holds the same
 * main array and (start, end) ranges mean the same rows on both sides.
 *
 * Insertion engine (Figure 8: a merger streams two sorted inputs through one
 * comparator into one output):
 *   merge_path  one work-item per cut t = 0..parts: the co-ranks (oi[t], oj[t])
 *               that cut the moving part of the merged output into pieces of
 *               equal size (merge-path split), main tuples left of run tuples
 *               on equal keys;
 *   stash       one work-item per merger: copies the front main rows of its
 *               piece that the mergers left of it will overwrite;
 *   merger      one work-item per merger: merges its piece IN PLACE from the
 *               back (a main tuple only moves right), stash for the front part;
 *   indexer     one work-item per index entry: idx[q] = mk[q * step].
 * Example, main [1 4 7 9 _ _], run [5 8], one merger, from the back:
 *   9 > 8 -> [.. 9], 8 > 7 -> [.. 8 9], 7 > 5 -> [.. 7 8 9], run's 5 -> [1 4 5 7 8 9].
 *
 * Probing engine (Figure 9: a prober streams a partition against the bounds):
 *   boundary_generator one work-item per (probe tuple, band), int64 keys: the closed
 *               interval [lo, hi] of stored keys, overflow detected, not wrapped (float64
 *               keys: the host's panjoin.semantics.probe_bounds, which rounds each edge
 *               to the ulp, and the probe's lo/hi are uploaded);
 *   partitioner one work-item per (chunk of the sorted probe batch, band): the
 *               target partition of each bound through the index array, by a
 *               rebounding (galloping) search whose cursor only moves right;
 *   prober_count one work-item per chunk: the exact start/end rows inside the
 *               target partitions, then the number of results per probe tuple
 *               (pairs after the window filter, or non-empty ranges) and of
 *               buffer matches (the unsorted insertion buffer is scanned);
 *   prober_emit one work-item per chunk: writes the results at the offsets the
 *               host's prefix sum gave each probe tuple.
 * Example, step 4, main [1 3 3 5 | 8 9 9 9 | 12 14 15 20], index [1 8 12], band [2, 4]:
 * partitioner: first entry >= 2 is 8 (q = 1), first entry > 4 is 8 (q = 1);
 * prober: start in rows (0, 4] -> 1, end in rows (0, 4] -> 3: keys 3 3.
 */

#ifdef KEY_IS_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

#define G __global

/* window filter modes, as panjoin/subwindow/kernels/window.py */
#define MODE_NONE 0
#define MODE_TIME 1
#define MODE_COUNT 2

/* ------------------------------------------------------------------ searches */

/* smallest i in [start, end] with a[i] >= x (end if none): gallop then bisect */
long gallop_left(G const KEY_T *a, KEY_T x, long start, long end)
{
    if (start >= end || a[start] >= x)
        return start;
    long lo = start, step = 1, hi = start + 1;
    while (hi < end && a[hi] < x) {
        lo = hi;
        step <<= 1;
        hi = lo + step;
    }
    if (hi > end)
        hi = end;
    while (hi - lo > 1) {
        long mid = (lo + hi) >> 1;
        if (a[mid] < x)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

/* smallest i in [start, end] with a[i] > x (end if none) */
long gallop_right(G const KEY_T *a, KEY_T x, long start, long end)
{
    if (start >= end || a[start] > x)
        return start;
    long lo = start, step = 1, hi = start + 1;
    while (hi < end && a[hi] <= x) {
        lo = hi;
        step <<= 1;
        hi = lo + step;
    }
    if (hi > end)
        hi = end;
    while (hi - lo > 1) {
        long mid = (lo + hi) >> 1;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

/* smallest i in [lo, hi) with a[i] >= x (hi if none); strict: a[i] > x */
long bisect(G const KEY_T *a, KEY_T x, long lo, long hi, int strict)
{
    while (lo < hi) {
        long mid = (lo + hi) >> 1;
        int before = strict ? (a[mid] <= x) : (a[mid] < x);
        if (before)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ------------------------------------------------------------------ insertion engine */

/* main tuples among the first o outputs of the stable merge (main first on ties) */
long corank(G const KEY_T *mk, long m, G const KEY_T *rk, long r, long o)
{
    long lo = o > r ? o - r : 0;
    long hi = o < m ? o : m;
    while (lo < hi) {
        long mid = (lo + hi) >> 1;
        /* main[mid] precedes run[o - mid - 1]: it is among the first o outputs too */
        if (mk[mid] <= rk[o - mid - 1])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__kernel void merge_path(G const KEY_T *mk, long m, G const KEY_T *rk, long r, long parts,
                         G long *oi, G long *oj)
{
    long t = get_global_id(0);
    if (t > parts)
        return;
    /* main tuples with key <= the run's smallest stay in place: cut only the rest */
    long base = bisect(mk, rk[0], 0, m, 1);
    long n = m + r;
    long o = base + ((n - base) * t) / parts;
    long i = corank(mk, m, rk, r, o);
    oi[t] = i;
    oj[t] = o - i;
}

__kernel void stash(G const KEY_T *mk, G const long *mt, G const long *ms, G const long *oi,
                    G const long *soff, G KEY_T *sk, G long *st, G long *ss)
{
    long t = get_global_id(0);
    long a = soff[t], z = soff[t + 1], i0 = oi[t];
    for (long x = 0; x < z - a; x++) {
        sk[a + x] = mk[i0 + x];
        st[a + x] = mt[i0 + x];
        ss[a + x] = ms[i0 + x];
    }
}

/* A (na rows) and R (nr rows) into W (na + nr rows) from the back. W may be A's memory
 * shifted right; copy_rest 0 when W's front IS A's front (the rows of A left when R
 * runs out are then already in place). */
void merge_views(G KEY_T *wk, G long *wt, G long *ws, G const KEY_T *ak, G const long *at,
                 G const long *aS, long na, G const KEY_T *rk, G const long *rt,
                 G const long *rs, long nr, int copy_rest)
{
    long i = na, j = nr, w = na + nr;
    while (j > 0) {
        w--;
        if (i > 0 && ak[i - 1] > rk[j - 1]) {
            i--;
            wk[w] = ak[i];
            wt[w] = at[i];
            ws[w] = aS[i];
        } else {
            j--;
            wk[w] = rk[j];
            wt[w] = rt[j];
            ws[w] = rs[j];
        }
    }
    if (copy_rest)
        for (long x = i - 1; x >= 0; x--) { /* backwards: W[x] lies at or right of A[x] */
            wk[x] = ak[x];
            wt[x] = at[x];
            ws[x] = aS[x];
        }
}

/* Merger t: output rows [oi[t] + oj[t], oi[t+1] + oj[t+1]) from main rows [oi[t], oi[t+1])
 * (the first soff[t+1] - soff[t] of them from the stash) and run rows [oj[t], oj[t+1]).
 * Split at the first main row not stashed (s_end): run rows with a smaller key go with
 * the stashed rows. The upper part merges in place first, then the lower part below it. */
__kernel void merger(G KEY_T *mk, G long *mt, G long *ms, G const KEY_T *rk, G const long *rt,
                     G const long *rs, G const long *oi, G const long *oj, G const long *soff,
                     G const KEY_T *sk, G const long *st, G const long *ss)
{
    long t = get_global_id(0);
    long i0 = oi[t], i1 = oi[t + 1], j0 = oj[t], j1 = oj[t + 1];
    long a = soff[t];
    long s_end = i0 + soff[t + 1] - a;
    long jm = j1;
    if (s_end < i1) {
        KEY_T pivot = mk[s_end];
        jm = j0;
        while (jm < j1 && rk[jm] < pivot)
            jm++;
    }
    merge_views(mk + s_end + jm, mt + s_end + jm, ms + s_end + jm, mk + s_end, mt + s_end,
                ms + s_end, i1 - s_end, rk + jm, rt + jm, rs + jm, j1 - jm, jm > 0);
    merge_views(mk + i0 + j0, mt + i0 + j0, ms + i0 + j0, sk + a, st + a, ss + a, s_end - i0,
                rk + j0, rt + j0, rs + j0, jm - j0, 1);
}

__kernel void indexer(G const KEY_T *mk, long step, long nidx, G KEY_T *idx)
{
    long q = get_global_id(0);
    if (q < nidx) /* the launch is padded to whole work-groups */
        idx[q] = mk[q * step];
}

/* ------------------------------------------------------------------ probing engine */

int in_window(int mode, long c0, long c1, long c2, long seq, long ts)
{
    if (mode == MODE_NONE)
        return 1;
    if (mode == MODE_TIME)
        return c0 <= ts && ts <= c1; /* closed: saturated bounds stay exact */
    if (seq < c1)
        return seq >= c0;
    return ts <= c2;
}

#ifndef KEY_IS_DOUBLE
/* Boundary generator (b, i), int64 keys: band b of probe key k is [k + ea[b], k + eb[b]]
 * on the stored keys, exactly as panjoin.semantics.probe_bounds: flags bit 1: no lower
 * edge (lo = MIN), bit 2: no upper edge (hi = MAX), bit 4: the band holds no integer.
 * A sum past the int64 range is not wrapped: k + a above MAX (or k + b below MIN)
 * leaves nothing to match, so the band is empty (lo = MAX > hi = MIN); k + a below MIN
 * clamps lo to MIN and k + b above MAX clamps hi to MAX. */
__kernel void boundary_generator(G const long *keys, long n, G const long *ea,
                                 G const long *eb, G const int *flags, G long *lo, G long *hi)
{
    long i = get_global_id(0), b = get_global_id(1);
    if (i >= n) /* the launch is padded to whole work-groups */
        return;
    long k = keys[i], a = ea[b], e = eb[b];
    int f = flags[b];
    int empty = (f & 4) != 0;
    long l = LONG_MIN, h = LONG_MAX;
    if (!(f & 1)) {
        if (a > 0 && k > LONG_MAX - a)
            empty = 1;
        else if (!(a < 0 && k < LONG_MIN - a))
            l = k + a;
    }
    if (!(f & 2)) {
        if (e < 0 && k < LONG_MIN - e)
            empty = 1;
        else if (!(e > 0 && k > LONG_MAX - e))
            h = k + e;
    }
    lo[b * n + i] = empty ? LONG_MAX : l;
    hi[b * n + i] = empty ? LONG_MIN : h;
}
#endif

/* probe tuples [chunk_lo(t), chunk_lo(t + 1)) of n, over parts chunks */
long chunk_lo(long n, long t, long parts) { return (n * t) / parts; }

/* Partitioner (t, b): per bound, the first index entry >= lo (qs) and > hi (qe); the
 * answer lies in the one partition of main rows ((q - 1) step, q step]. Empty bands
 * (lo > hi) get qs = -1 and move no cursor. */
__kernel void partitioner(G const KEY_T *idx, long nidx, long m, G const KEY_T *lo,
                          G const KEY_T *hi, long n, long parts, G long *qs, G long *qe)
{
    long t = get_global_id(0), b = get_global_id(1);
    long q_s = 0, q_e = 0;
    for (long i = chunk_lo(n, t, parts); i < chunk_lo(n, t + 1, parts); i++) {
        KEY_T l = lo[b * n + i], h = hi[b * n + i];
        if (l > h || m == 0) {
            qs[b * n + i] = -1;
            continue;
        }
        q_s = gallop_left(idx, l, q_s, nidx);
        if (q_e < q_s)
            q_e = q_s;
        q_e = gallop_right(idx, h, q_e, nidx);
        qs[b * n + i] = q_s;
        qe[b * n + i] = q_e;
    }
}

/* buffer tuples matching probe tuple i in any band: a linear scan (unsorted buffer) */
long buffer_count(G const KEY_T *bk, G const long *bt, G const long *bs, long nbuf,
                  G const KEY_T *lo, G const KEY_T *hi, long nb, long n, long i, int mode,
                  long c0, long c1, long c2)
{
    long c = 0;
    for (long b = 0; b < nb; b++) {
        KEY_T l = lo[b * n + i], h = hi[b * n + i];
        if (l > h)
            continue;
        for (long p = 0; p < nbuf; p++)
            c += bk[p] >= l && bk[p] <= h && in_window(mode, c0, c1, c2, bs[p], bt[p]);
    }
    return c;
}

/* Prober t, pass 1: start/end rows of every (band, probe tuple) of its chunk inside the
 * target partitions, and per probe tuple the count of main results (pairs after the
 * filter, or non-empty ranges when ranges != 0) in counts[i], and of buffer pairs in
 * counts[n + i]. */
__kernel void prober_count(G const KEY_T *mk, G const long *mt, G const long *ms, long m,
                           long step, G const KEY_T *bk, G const long *bt, G const long *bs,
                           long nbuf, G const KEY_T *lo, G const KEY_T *hi, long nb, long n,
                           long parts, G const long *qs, G const long *qe, int mode,
                           G const long *c0, G const long *c1, G const long *c2, int ranges,
                           G long *st, G long *en, G long *counts)
{
    long t = get_global_id(0);
    for (long i = chunk_lo(n, t, parts); i < chunk_lo(n, t + 1, parts); i++) {
        long cf0 = mode ? c0[i] : 0, cf1 = mode ? c1[i] : 0, cf2 = mode ? c2[i] : 0;
        long c = 0;
        for (long b = 0; b < nb; b++) {
            long k = b * n + i;
            long q_s = qs[k];
            if (q_s < 0) { /* empty band */
                st[k] = 0;
                en[k] = 0;
                continue;
            }
            long q_e = qe[k];
            long s = bisect(mk, lo[k], q_s > 0 ? (q_s - 1) * step + 1 : 0, min(q_s * step, m), 0);
            long e0 = q_e > 0 ? (q_e - 1) * step + 1 : 0;
            long e = bisect(mk, hi[k], max(e0, s), min(q_e * step, m), 1);
            st[k] = s;
            en[k] = e;
            if (ranges)
                c += e > s;
            else if (mode == MODE_NONE)
                c += e - s;
            else
                for (long p = s; p < e; p++)
                    c += in_window(mode, cf0, cf1, cf2, ms[p], mt[p]);
        }
        counts[i] = c;
        /* the buffer's count in the second half: one read-back brings both */
        counts[n + i] = nbuf ? buffer_count(bk, bt, bs, nbuf, lo, hi, nb, n, i, mode, cf0, cf1,
                                            cf2) : 0;
    }
}

/* Prober t, pass 2: results of its chunk from the offsets of pass 1's prefix sums.
 * Pairs (ranges == 0): per probe tuple its main pairs band by band, then its buffer
 * pairs, at offs[i] into (out_probe, out_a). Ranges: records (out_probe, out_a = start,
 * out_b = end) at offs[i], buffer pairs (buf_probe, buf_seq) at boffs[i]. */
__kernel void prober_emit(G const KEY_T *mk, G const long *mt, G const long *ms,
                          G const KEY_T *bk, G const long *bt, G const long *bs, long nbuf,
                          G const KEY_T *lo, G const KEY_T *hi, long nb, long n, long parts,
                          int mode, G const long *c0, G const long *c1, G const long *c2,
                          int ranges, G const long *st, G const long *en, G const long *offs,
                          G const long *boffs, G long *out_probe, G long *out_a, G long *out_b,
                          G long *buf_probe, G long *buf_seq)
{
    long t = get_global_id(0);
    for (long i = chunk_lo(n, t, parts); i < chunk_lo(n, t + 1, parts); i++) {
        long cf0 = mode ? c0[i] : 0, cf1 = mode ? c1[i] : 0, cf2 = mode ? c2[i] : 0;
        long pos = offs[i];
        for (long b = 0; b < nb; b++) {
            long k = b * n + i;
            long s = st[k], e = en[k];
            if (ranges) {
                if (e > s) {
                    out_probe[pos] = i;
                    out_a[pos] = s;
                    out_b[pos] = e;
                    pos++;
                }
            } else {
                for (long p = s; p < e; p++)
                    if (in_window(mode, cf0, cf1, cf2, ms[p], mt[p])) {
                        out_probe[pos] = i;
                        out_a[pos] = ms[p];
                        pos++;
                    }
            }
        }
        if (!nbuf)
            continue;
        long bpos = ranges ? boffs[i] : pos;
        G long *dst_probe = ranges ? buf_probe : out_probe;
        G long *dst_seq = ranges ? buf_seq : out_a;
        for (long b = 0; b < nb; b++) {
            KEY_T l = lo[b * n + i], h = hi[b * n + i];
            if (l > h)
                continue;
            for (long p = 0; p < nbuf; p++)
                if (bk[p] >= l && bk[p] <= h && in_window(mode, cf0, cf1, cf2, bs[p], bt[p])) {
                    dst_probe[bpos] = i;
                    dst_seq[bpos] = bs[p];
                    bpos++;
                }
        }
    }
}
