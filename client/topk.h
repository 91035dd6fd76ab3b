/* topk.h - libpsclient: top-k sparsification with error feedback, the
 * selection alone (no client, no I/O), so a unit test links it by itself. */
#ifndef PS_CLIENT_TOPK_H
#define PS_CLIENT_TOPK_H

#include <stddef.h>

/* k for n values at ratio r (0 < r <= 1): ceil(r * n), at least 1 and at
 * most n; 0 when n is 0. */
size_t psc__topk_k(double ratio, size_t n);

/* One step of error feedback over n values: a = g + resid; of a, the k
 * largest in magnitude (NaN counts as largest, ties in index order) stay
 * in g, every other value of g becomes 0; resid becomes a with those k
 * values 0. So g (what is sent) plus the new resid is exactly a, value by
 * value. scratch holds n floats (its contents are overwritten). Returns
 * how many values g keeps (k, or fewer when n < k). */
size_t psc__topk_select(float *g, float *resid, size_t n, size_t k, float *scratch);

#endif
