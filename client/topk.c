/* topk.c - libpsclient: top-k sparsification with error feedback (option
 * topk): which values of gradient plus residual a push sends, and what the
 * residual keeps. step.c runs it on each tensor of a push before it goes. */
#include "topk.h"

#include <math.h>
#include <stdint.h>

size_t psc__topk_k(double ratio, size_t n)
{
    if (n == 0)
        return 0;
    double k = ceil(ratio * (double)n);
    if (!(k >= 1))
        return 1;
    return k >= (double)n ? n : (size_t)k;
}

/* magnitude for selection: NaN above everything, so it is sent and psd
 * refuses the push (NONFINITE) instead of a residual keeping it for ever */
static float mag(float v)
{
    return isnan(v) ? INFINITY : fabsf(v);
}

/* The k-th largest of a[0..n) (1 <= k <= n), reordering a: quickselect
 * with a median-of-three pivot and a three-way partition, so runs of equal
 * values (zeros) cost one pass. */
static float kth_largest(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n, want = k - 1; /* index in descending order */
    for (;;) {
        if (hi - lo == 1)
            return a[lo];
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
        float p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        /* [lo, gt) > p, [gt, i) == p, [lt2, hi) < p */
        size_t gt = lo, i = lo, lt = hi;
        while (i < lt) {
            float v = a[i];
            if (v > p) {
                a[i] = a[gt];
                a[gt++] = v;
                i++;
            } else if (v < p) {
                a[i] = a[--lt];
                a[lt] = v;
            } else {
                i++;
            }
        }
        if (want < gt)
            hi = gt;
        else if (want < lt)
            return p;
        else
            lo = lt;
    }
}

size_t psc__topk_select(float *g, float *resid, size_t n, size_t k, float *scratch)
{
    if (n == 0 || k == 0) {
        for (size_t i = 0; i < n; i++) {
            resid[i] += g[i];
            g[i] = 0.0f;
        }
        return 0;
    }
    if (k > n)
        k = n;
    for (size_t i = 0; i < n; i++) {
        g[i] += resid[i];
        scratch[i] = mag(g[i]);
    }
    float thr = kth_largest(scratch, n, k);
    size_t above = 0;
    for (size_t i = 0; i < n; i++)
        above += mag(g[i]) > thr;
    size_t ties = k - above, kept = 0; /* values equal to thr that are kept, first ones first */
    for (size_t i = 0; i < n; i++) {
        float m = mag(g[i]);
        if (m > thr || (m == thr && ties > 0)) {
            if (!(m > thr))
                ties--;
            resid[i] = 0.0f;
            kept++;
        } else {
            resid[i] = g[i];
            g[i] = 0.0f;
        }
    }
    return kept;
}
