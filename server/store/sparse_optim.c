/* sparse_optim.c - one optimizer step on one table row (see sparse_optim.h,
 * PROTOCOL.md 13.4). */
#include "server/store/sparse_optim.h"

#include <math.h>
#include <string.h>

uint32_t srv_sparse_row_floats(const ps_table_def *d)
{
    return d->dim * (1 + ps_topt_state_per_value(d->opt)) + (ps_topt_has_step(d->opt) ? 1 : 0);
}

uint32_t srv_sparse_row_step(const ps_table_def *d, const float *row)
{
    if (!ps_topt_has_step(d->opt))
        return 0;
    uint32_t t;
    memcpy(&t, row + d->dim * 3, sizeof t);
    return t;
}

void srv_sparse_row_new(const ps_table_def *d, uint64_t key, float *row)
{
    uint32_t dim = d->dim, nf = srv_sparse_row_floats(d);
    if (d->opt == PS_TOPT_FTRL)
        memset(row, 0, sizeof(float) * dim);
    else
        ps_table_row_init(d, key, row);
    memset(row + dim, 0, sizeof(float) * (nf - dim)); /* state and step: all bits 0 */
    if (d->opt == PS_TOPT_ADAGRAD)
        for (uint32_t j = 0; j < dim; j++)
            row[dim + j] = (float)d->hp[PS_HP_IACC];
}

static int finite_all(const float *v, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        if (!isfinite(v[j]))
            return 0;
    return 1;
}

int srv_sparse_step(const ps_table_def *d, float *row, const float *g, double scale)
{
    const uint32_t dim = d->dim;
    const double lr = d->hp[PS_HP_LR];
    float *w = row;
    switch (d->opt) {
    case PS_TOPT_SGD:
        for (uint32_t j = 0; j < dim; j++)
            w[j] = (float)((double)w[j] - lr * (scale * g[j]));
        return finite_all(w, dim);
    case PS_TOPT_ADAGRAD: {
        float *a = row + dim;
        const double eps = d->hp[PS_HP_EPS];
        for (uint32_t j = 0; j < dim; j++) {
            double gj = scale * g[j];
            double aj = (double)a[j] + gj * gj;
            a[j] = (float)aj;
            w[j] = (float)((double)w[j] - lr * gj / (sqrt((double)a[j]) + eps));
        }
        return finite_all(w, 2 * dim);
    }
    case PS_TOPT_ADAM: {
        float *m = row + dim, *v = row + 2 * dim;
        const double b1 = d->hp[PS_HP_BETA1], b2 = d->hp[PS_HP_BETA2], eps = d->hp[PS_HP_EPS];
        uint32_t t;
        memcpy(&t, row + 3 * dim, sizeof t);
        if (t < UINT32_MAX)
            t++;
        memcpy(row + 3 * dim, &t, sizeof t);
        const double step = lr * sqrt(1.0 - pow(b2, (double)t)) / (1.0 - pow(b1, (double)t));
        for (uint32_t j = 0; j < dim; j++) {
            double gj = scale * g[j];
            m[j] = (float)(b1 * m[j] + (1.0 - b1) * gj);
            v[j] = (float)(b2 * v[j] + (1.0 - b2) * gj * gj);
            w[j] = (float)((double)w[j] - step * (double)m[j] / (sqrt((double)v[j]) + eps));
        }
        return finite_all(w, 3 * dim);
    }
    case PS_TOPT_FTRL: {
        float *z = row + dim, *n = row + 2 * dim;
        const double beta = d->hp[PS_HP_BETA], l1 = d->hp[PS_HP_L1], l2 = d->hp[PS_HP_L2];
        for (uint32_t j = 0; j < dim; j++) {
            double gj = scale * g[j], nj = n[j];
            double sigma = (sqrt(nj + gj * gj) - sqrt(nj)) / lr;
            double zj = (double)z[j] + gj - sigma * (double)w[j];
            nj += gj * gj;
            z[j] = (float)zj;
            n[j] = (float)nj;
            if (fabs(zj) <= l1)
                w[j] = 0.0f;
            else
                w[j] = (float)(-(zj - copysign(l1, zj)) / ((beta + sqrt((double)n[j])) / lr + l2));
        }
        return finite_all(w, 3 * dim);
    }
    default:
        return 0;
    }
}
