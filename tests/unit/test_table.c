/* test_table.c - psd's row store (server/tables/table.c) and its sparse
 * optimizers (server/tables/sparse_optim.c).
 *
 * The optimizers against references: PyTorch's Adagrad (sparse gradient,
 * initial_accumulator_value), SparseAdam and SGD on an nn.Embedding(2, 3,
 * sparse=True) over three steps (values printed by PyTorch 1.13 and pinned
 * here), FTRL-proximal against a straightforward implementation of McMahan
 * et al.'s Algorithm 1 in Python; and, through the store, long random runs
 * against a plain reference written below (a list of rows, one optimizer
 * step per pushed row, lazy Adam's step counted per row).
 *
 * The store: rows created on first push from (seed, key), pulls that store
 * nothing, keys anywhere in 0..2^64-1 (0 and ~0 too), growth through many
 * rehashes, memory counted and max_table_memory refusing a push whole,
 * NONFINITE updates refused whole, declarations compared, the 65th table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/table.h"
#include "server/tables/sparse_optim.h"
#include "server/tables/table.h"
#include "server/policy/bsp_tround.h"

#define assert_has(text, needle)                                                                                   \
    do {                                                                                                           \
        if (strstr((text), (needle)) == NULL)                                                                      \
            fail_msg("\"%s\" lacks \"%s\"", (text), (needle));                                                    \
    } while (0)

static char err[512];

static ps_table_def def(const char *name, uint32_t dim, const char *rinit, double scale, const char *opt,
                        const ps_hp *hp)
{
    ps_table_def d;
    if (ps_table_def_make(&d, name, dim, rinit, scale > 0, scale, 11, opt, hp, err, sizeof err) != 0)
        fail_msg("def: %s", err);
    return d;
}

static ps_hp hp1(int id, double v)
{
    ps_hp h = {0};
    h.has = 1u << id;
    h.v[id] = v;
    return h;
}

static void keys_le(uint8_t *out, const uint64_t *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            out[8 * i + b] = (uint8_t)(k[i] >> (8 * b));
}

/* ---- optimizers against PyTorch and the paper ------------------------------------- */

static const float W0[2][3] = {{0.5f, -0.25f, 0.125f}, {1.0f, 2.0f, -3.0f}};
static const float G[3][2][3] = {{{0.1f, -0.2f, 0.3f}, {1.0f, 0.0f, -2.0f}},
                                 {{-0.4f, 0.5f, 0.05f}, {0.3f, -0.7f, 1.5f}},
                                 {{0.2f, 0.2f, -0.9f}, {-1.0f, 0.25f, 0.0f}}};

/* Three steps of d's optimizer on the two rows W0; compares the weights. */
static void three_steps(const ps_table_def *d, const float want[6], double tol)
{
    uint32_t nf = srv_sparse_row_floats(d);
    float *row[2];
    for (int r = 0; r < 2; r++) {
        row[r] = calloc(nf, sizeof(float));
        assert_non_null(row[r]);
        srv_sparse_row_new(d, (uint64_t)r, row[r]);
        if (d->opt != PS_TOPT_FTRL)
            memcpy(row[r], W0[r], sizeof W0[r]);
    }
    for (int s = 0; s < 3; s++)
        for (int r = 0; r < 2; r++)
            assert_true(srv_sparse_step(d, row[r], G[s][r], 1.0));
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            double got = row[r][j], w = want[3 * r + j];
            if (fabs(got - w) > tol * (1.0 + fabs(w)))
                fail_msg("%s: row %d value %d: %.9g, reference %.9g", ps_topt_name(d->opt), r, j, got, w);
        }
    if (d->opt == PS_TOPT_ADAM)
        assert_int_equal(srv_sparse_row_step(d, row[0]), 3);
    free(row[0]);
    free(row[1]);
}

static void test_sgd_against_pytorch(void **state)
{
    (void)state;
    ps_hp hp = hp1(PS_HP_LR, 0.1);
    ps_table_def d = def("e", 3, "zeros", 0, "sgd", &hp);
    static const float want[6] = {0.51000005f, -0.300000012f, 0.179999992f, 0.969999969f, 2.04499984f, -2.95000005f};
    three_steps(&d, want, 1e-6);
}

static void test_adagrad_against_pytorch(void **state)
{
    (void)state;
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR | 1u << PS_HP_EPS | 1u << PS_HP_IACC;
    hp.v[PS_HP_LR] = 0.1, hp.v[PS_HP_EPS] = 1e-10, hp.v[PS_HP_IACC] = 0.5;
    ps_table_def d = def("e", 3, "zeros", 0, "adagrad", &hp);
    /* torch.optim.Adagrad(lr=0.1, eps=1e-10, initial_accumulator_value=0.5) */
    static const float want[6] = {0.51112932f, -0.300990671f, 0.155443683f, 0.956695795f, 2.04598403f, -2.96345401f};
    three_steps(&d, want, 1e-6);
}

static void test_adam_against_pytorch(void **state)
{
    (void)state;
    ps_hp hp = hp1(PS_HP_LR, 0.01);
    ps_table_def d = def("e", 3, "zeros", 0, "adam", &hp);
    /* torch.optim.SparseAdam(lr=0.01): every row in every step, so its step
     * count (per tensor) equals ours (per row) */
    static const float want[6] = {0.4966968f, -0.249851584f, 0.11128246f, 0.981089354f, 2.01070857f, -2.98841619f};
    three_steps(&d, want, 1e-6);
}

static void test_ftrl_against_reference(void **state)
{
    (void)state;
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR | 1u << PS_HP_BETA | 1u << PS_HP_L1 | 1u << PS_HP_L2;
    hp.v[PS_HP_LR] = 0.5, hp.v[PS_HP_BETA] = 1.0, hp.v[PS_HP_L1] = 0.1, hp.v[PS_HP_L2] = 0.2;
    ps_table_def d = def("e", 3, "zeros", 0, "ftrl", &hp);
    static const float want[6] = {0.00194974172f, -0.112805566f, 0.0814986117f,
                                  -0.0878364777f, 0.0988536293f, 0.0981182796f};
    three_steps(&d, want, 1e-5);
    /* L1 keeps small weights at exactly 0 */
    hp.v[PS_HP_L1] = 10.0;
    d = def("e", 3, "zeros", 0, "ftrl", &hp);
    float row[9];
    srv_sparse_row_new(&d, 1, row);
    for (int s = 0; s < 3; s++)
        assert_true(srv_sparse_step(&d, row, G[s][0], 1.0));
    for (int j = 0; j < 3; j++)
        assert_true(row[j] == 0.0f);
    assert_true(row[3] != 0.0f && row[6] > 0.0f); /* z and n moved */
}

/* An update that overflows is reported, whatever the optimizer. */
static void test_step_overflow(void **state)
{
    (void)state;
    static const char *const opts[] = {"sgd", "adagrad", "adam", "ftrl"};
    const float huge[2] = {3e38f, -3e38f};
    for (int o = 0; o < 4; o++) {
        ps_hp hp = hp1(PS_HP_LR, 1e30);
        ps_table_def d = def("e", 2, "zeros", 0, opts[o], &hp);
        float row[8];
        srv_sparse_row_new(&d, 1, row);
        row[0] = 3e38f;
        int ok = 1;
        for (int s = 0; s < 3 && ok; s++)
            ok = srv_sparse_step(&d, row, huge, 1.0);
        if (ok)
            fail_msg("%s: no overflow reported", opts[o]);
    }
}

/* The step as plain scalar formulas (the reference the kernels must equal
 * bit for bit): new values into w, s1, s2 (dim each). */
static void scalar_step(const ps_table_def *d, const float *row, const float *g, double scale, float *w, float *s1,
                        float *s2, uint32_t t)
{
    const uint32_t dim = d->dim;
    const double lr = d->hp[PS_HP_LR], eps = d->hp[PS_HP_EPS];
    for (uint32_t j = 0; j < dim; j++) {
        double gj = scale * g[j];
        switch (d->opt) {
        case PS_TOPT_SGD:
            w[j] = (float)((double)row[j] - lr * gj);
            break;
        case PS_TOPT_ADAGRAD: { /* float32, as PyTorch */
            float gf = (float)scale * g[j];
            s1[j] = row[dim + j] + gf * gf;
            w[j] = row[j] - (float)lr * (gf / (sqrtf(s1[j]) + (float)eps));
            break;
        }
        case PS_TOPT_ADAM: {
            double b1 = d->hp[PS_HP_BETA1], b2 = d->hp[PS_HP_BETA2];
            double step = lr * sqrt(1.0 - pow(b2, (double)t)) / (1.0 - pow(b1, (double)t));
            s1[j] = (float)(b1 * row[dim + j] + (1.0 - b1) * gj);
            s2[j] = (float)(b2 * row[2 * dim + j] + (1.0 - b2) * gj * gj);
            w[j] = (float)((double)row[j] - step * (double)s1[j] / (sqrt((double)s2[j]) + eps));
            break;
        }
        default: { /* ftrl */
            double beta = d->hp[PS_HP_BETA], l1 = d->hp[PS_HP_L1], l2 = d->hp[PS_HP_L2], nj = row[2 * dim + j];
            double zj = (double)row[dim + j] + gj - (sqrt(nj + gj * gj) - sqrt(nj)) / lr * (double)row[j];
            s1[j] = (float)zj;
            s2[j] = (float)(nj + gj * gj);
            w[j] = fabs(zj) <= l1 ? 0.0f
                                  : (float)(-(zj - copysign(l1, zj)) / ((beta + sqrt((double)s2[j])) / lr + l2));
        }
        }
    }
}

/* The step's kernels (fixed dims 8, 16, 32, 64 unrolled, any other dim,
 * rows longer than a chunk) equal the plain formulas bit for bit, every
 * optimizer, over several steps and a scale. */
static void test_step_kernels_exact(void **state)
{
    (void)state;
    static const char *const opts[] = {"sgd", "adagrad", "adam", "ftrl"};
    static const uint32_t dims[] = {1, 3, 8, 16, 17, 32, 64, 100, 128, 129, 300, 1024};
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR;
    hp.v[PS_HP_LR] = 0.05;
    for (int o = 0; o < 4; o++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            uint32_t dim = dims[di];
            ps_table_def d = def("e", dim, "zeros", 0, opts[o], &hp);
            uint32_t nf = srv_sparse_row_floats(&d);
            float *row = calloc(nf, sizeof(float)), *g = calloc(dim, sizeof(float));
            float *w = calloc(3 * (size_t)dim, sizeof(float));
            assert_non_null(row);
            assert_non_null(g);
            assert_non_null(w);
            srv_sparse_row_new(&d, 7, row);
            for (uint32_t j = 0; j < dim && d.opt != PS_TOPT_FTRL; j++)
                row[j] = (float)sin(0.37 * j + dim);
            /* the same row stepped by srv_sparse_step_rows, as the second of
             * two rows of which the first is none (NULL) */
            float *row2 = malloc(sizeof(float) * nf), *g2 = calloc(2 * (size_t)dim, sizeof(float));
            float *row3 = malloc(sizeof(float) * nf); /* and by srv_sparse_step_all */
            assert_non_null(row2);
            assert_non_null(g2);
            assert_non_null(row3);
            memcpy(row2, row, sizeof(float) * nf);
            memcpy(row3, row, sizeof(float) * nf);
            float *const two[2] = {NULL, row2}, *const two3[2] = {NULL, row3};
            for (uint32_t s = 1; s <= 4; s++) {
                for (uint32_t j = 0; j < dim; j++)
                    g2[j] = NAN, g2[dim + j] = g[j] = (float)(cos(1.3 * j + 0.7 * s + o) * (1.0 + j % 5));
                double scale = s == 3 ? 1.0 / 3 : 1.0;
                scalar_step(&d, row, g, scale, w, w + dim, w + 2 * dim, s);
                assert_true(srv_sparse_step(&d, row, g, scale));
                uint32_t parts = 1 + ps_topt_state_per_value(d.opt);
                if (memcmp(row, w, sizeof(float) * parts * dim) != 0)
                    fail_msg("%s dim %u step %u: not the scalar formulas' bits", opts[o], dim, s);
                assert_int_equal(srv_sparse_step_rows(&d, two, g2, 2, scale), 2);
                if (memcmp(row2, row, sizeof(float) * nf) != 0)
                    fail_msg("%s dim %u step %u: srv_sparse_step_rows differs from srv_sparse_step", opts[o], dim, s);
                assert_int_equal(srv_sparse_step_all(&d, two3, g2, 2, scale), 1);
                if (memcmp(row3, row, sizeof(float) * nf) != 0)
                    fail_msg("%s dim %u step %u: srv_sparse_step_all differs from srv_sparse_step", opts[o], dim, s);
            }
            free(row2);
            free(row3);
            free(g2);
            if (d.opt == PS_TOPT_ADAM)
                assert_int_equal(srv_sparse_row_step(&d, row), 4);
            free(row);
            free(g);
            free(w);
        }
}

/* A step whose result is not finite leaves its row as it was, every value
 * and (adam) the step count, even when only the row's last value
 * overflows and the others (an earlier chunk of a long row) would not. */
static void test_step_nonfinite_leaves_row(void **state)
{
    (void)state;
    static const char *const opts[] = {"sgd", "adagrad", "adam", "ftrl"};
    static const uint32_t dims[] = {2, 16, 40, 300};
    for (int o = 0; o < 4; o++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            uint32_t dim = dims[di];
            ps_hp hp = hp1(PS_HP_LR, 1e30);
            ps_table_def d = def("e", dim, "zeros", 0, opts[o], &hp);
            uint32_t nf = srv_sparse_row_floats(&d);
            float *row = calloc(nf, sizeof(float)), *was = calloc(nf, sizeof(float));
            float *g = calloc(dim, sizeof(float));
            assert_non_null(row);
            assert_non_null(was);
            assert_non_null(g);
            srv_sparse_row_new(&d, 1, row);
            for (uint32_t j = 0; j < dim; j++)
                g[j] = 1e-3f;
            assert_true(srv_sparse_step(&d, row, g, 1.0)); /* a step that is fine first: state not zero */
            row[dim - 1] = 3e38f;
            g[dim - 1] = -3e38f;
            memcpy(was, row, sizeof(float) * nf);
            int ok = 1;
            for (int s = 0; s < 3 && ok; s++) {
                memcpy(was, row, sizeof(float) * nf);
                ok = srv_sparse_step(&d, row, g, 1.0);
            }
            if (ok)
                fail_msg("%s dim %u: no overflow reported", opts[o], dim);
            if (memcmp(row, was, sizeof(float) * nf) != 0)
                fail_msg("%s dim %u: a step that was not finite changed the row", opts[o], dim);
            free(row);
            free(was);
            free(g);
        }
}

/* ---- the store against a plain reference ------------------------------------------- */

/* The reference: rows in a list, found by a linear search. */
typedef struct ref_row {
    uint64_t key;
    double w[8], a[8], b[8];
    uint32_t t;
} ref_row;

typedef struct ref {
    ref_row *r;
    size_t n;
} ref;

static ref_row *ref_get(ref *rf, const ps_table_def *d, uint64_t key)
{
    for (size_t i = 0; i < rf->n; i++)
        if (rf->r[i].key == key)
            return &rf->r[i];
    rf->r = realloc(rf->r, sizeof *rf->r * (rf->n + 1));
    ref_row *x = &rf->r[rf->n++];
    memset(x, 0, sizeof *x);
    x->key = key;
    float init[8];
    ps_table_row_init(d, key, init);
    for (uint32_t j = 0; j < d->dim; j++) {
        x->w[j] = d->opt == PS_TOPT_FTRL ? 0.0 : init[j];
        x->a[j] = d->opt == PS_TOPT_ADAGRAD ? d->hp[PS_HP_IACC] : 0.0;
    }
    return x;
}

/* One step, straight from PROTOCOL.md 13.4 (state kept in double). */
static void ref_step(const ps_table_def *d, ref_row *x, const float *gf, double scale)
{
    const double lr = d->hp[PS_HP_LR];
    x->t++;
    for (uint32_t j = 0; j < d->dim; j++) {
        double g = scale * gf[j];
        switch (d->opt) {
        case PS_TOPT_SGD:
            x->w[j] -= lr * g;
            break;
        case PS_TOPT_ADAGRAD:
            x->a[j] += g * g;
            x->w[j] -= lr * g / (sqrt(x->a[j]) + d->hp[PS_HP_EPS]);
            break;
        case PS_TOPT_ADAM: {
            double b1 = d->hp[PS_HP_BETA1], b2 = d->hp[PS_HP_BETA2];
            x->a[j] = b1 * x->a[j] + (1 - b1) * g;
            x->b[j] = b2 * x->b[j] + (1 - b2) * g * g;
            double mhat = x->a[j] / (1 - pow(b1, x->t)), vhat = x->b[j] / (1 - pow(b2, x->t));
            /* the same as lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps) but for
             * where eps sits; eps is tiny next to sqrt(v) here */
            x->w[j] -= lr * mhat / (sqrt(vhat) + d->hp[PS_HP_EPS] / sqrt(1 - pow(b2, x->t)));
            break;
        }
        case PS_TOPT_FTRL: {
            double alpha = lr, sigma = (sqrt(x->b[j] + g * g) - sqrt(x->b[j])) / alpha;
            x->a[j] += g - sigma * x->w[j];
            x->b[j] += g * g;
            double z = x->a[j], l1 = d->hp[PS_HP_L1];
            x->w[j] = fabs(z) <= l1 ? 0.0
                                    : -(z - (z > 0 ? l1 : -l1)) / ((d->hp[PS_HP_BETA] + sqrt(x->b[j])) / alpha +
                                                                   d->hp[PS_HP_L2]);
            break;
        }
        }
    }
}

static uint64_t rng = 0x1234567;
static uint64_t rnd(void)
{
    rng += 0x9e3779b97f4a7c15ull;
    return ps_mix64(rng);
}

/* 300 pushes of 1..24 distinct keys out of 64 (some 0, ~0, 2^63), with pulls
 * between them, through the store and the reference: the rows agree. The
 * step count of lazy Adam is the row's own. */
static void random_run(const ps_table_def *d, double tol)
{
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, d, &ti, err, sizeof err), 0);
    ref rf = {0};
    uint64_t pool[64];
    for (int i = 0; i < 64; i++)
        pool[i] = i == 0 ? 0 : i == 1 ? UINT64_MAX : i == 2 ? 1ull << 63 : rnd();
    const uint32_t dim = d->dim;
    for (int step = 0; step < 300; step++) {
        uint32_t n = 1 + (uint32_t)(rnd() % 24);
        uint64_t k[24];
        int used[64] = {0};
        for (uint32_t i = 0; i < n; i++) {
            int p;
            do
                p = (int)(rnd() % 64);
            while (used[p]);
            used[p] = 1;
            k[i] = pool[p];
        }
        uint8_t kb[24 * 8];
        keys_le(kb, k, n);
        float g[24 * 8];
        for (uint32_t i = 0; i < n * dim; i++)
            g[i] = (float)((double)(rnd() >> 11) * 0x1p-53 * 2.0 - 1.0);
        double scale = step % 3 == 0 ? 0.5 : 1.0;
        assert_int_equal(srv_tables_push(&ts, ti, kb, n, g, scale, err, sizeof err), 0);
        for (uint32_t i = 0; i < n; i++)
            ref_step(d, ref_get(&rf, d, k[i]), g + i * dim, scale);
        /* pull every pool key: stored rows and initial ones */
        uint8_t pb[64 * 8];
        keys_le(pb, pool, 64);
        float out[64 * 8];
        srv_tables_pull(&ts, ti, pb, 64, out);
        for (int i = 0; i < 64; i++) {
            ref_row *x = NULL;
            for (size_t r = 0; r < rf.n; r++)
                if (rf.r[r].key == pool[i])
                    x = &rf.r[r];
            float init[8];
            ps_table_row_init(d, pool[i], init);
            for (uint32_t j = 0; j < dim; j++) {
                double want = x ? x->w[j] : d->opt == PS_TOPT_FTRL ? 0.0 : init[j];
                if (fabs(out[i * dim + j] - want) > tol * (1 + fabs(want)))
                    fail_msg("%s step %d key %llx value %u: %.9g, reference %.9g", ps_topt_name(d->opt), step,
                             (unsigned long long)pool[i], j, out[i * dim + j], want);
            }
            if (x && d->opt == PS_TOPT_ADAM)
                assert_int_equal(srv_sparse_row_step(d, srv_tables_row(&ts, ti, pool[i])), x->t);
        }
    }
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, rf.n);
    assert_true(st.rows_pulled == 300 * 64);
    free(rf.r);
    srv_tables_free(&ts);
}

static void test_store_against_reference(void **state)
{
    (void)state;
    ps_hp hp = hp1(PS_HP_LR, 0.05);
    ps_table_def d = def("s", 5, "uniform", 0.1, "sgd", &hp);
    random_run(&d, 2e-5);
    ps_hp ha = {0};
    ha.has = 1u << PS_HP_LR | 1u << PS_HP_IACC;
    ha.v[PS_HP_LR] = 0.05, ha.v[PS_HP_IACC] = 0.1;
    d = def("a", 4, "normal", 0.01, "adagrad", &ha);
    random_run(&d, 2e-5);
    d = def("m", 8, "uniform", 0.5, "adam", &hp);
    random_run(&d, 1e-4);
    ps_hp hf = {0};
    hf.has = 1u << PS_HP_LR | 1u << PS_HP_L1 | 1u << PS_HP_L2;
    hf.v[PS_HP_LR] = 0.1, hf.v[PS_HP_L1] = 0.2, hf.v[PS_HP_L2] = 0.1;
    d = def("f", 3, "zeros", 0, "ftrl", &hf);
    random_run(&d, 1e-4);
}

/* ---- the store itself ---------------------------------------------------------------- */

static void test_rows_created_on_push_only(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_table_def d = def("e", 4, "uniform", 0.05, "sgd", NULL);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 0);
    uint64_t before = ts.bytes;

    uint64_t k[3] = {42, 42, 7}; /* a pull may repeat a key */
    uint8_t kb[24];
    keys_le(kb, k, 3);
    float out[12], init[4];
    srv_tables_pull(&ts, ti, kb, 3, out);
    ps_table_row_init(&d, 42, init);
    assert_memory_equal(out, init, sizeof init);
    assert_memory_equal(out + 4, init, sizeof init);
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(ts.bytes, before);
    assert_null(srv_tables_row(&ts, ti, 42));

    const float g[4] = {1, 2, 3, 4};
    assert_int_equal(srv_tables_push(&ts, ti, kb, 1, g, 1.0, err, sizeof err), 0);
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 1);
    assert_true(ts.bytes > before);
    assert_int_equal(st.bytes, ts.bytes);
    const float *row = srv_tables_row(&ts, ti, 42);
    assert_non_null(row);
    for (int j = 0; j < 4; j++)
        assert_true(row[j] == (float)((double)init[j] - 0.01 * g[j]));
    srv_tables_pull(&ts, ti, kb, 3, out);
    assert_memory_equal(out, row, 4 * sizeof(float));
    assert_memory_equal(out + 4, row, 4 * sizeof(float));
    ps_table_row_init(&d, 7, init);
    assert_memory_equal(out + 8, init, sizeof init);
    srv_tables_free(&ts);
}

static void count_row(uint64_t key, const float *row, void *arg)
{
    uint64_t *seen = arg;
    assert_true(row[0] == (float)(key % 1000));
    seen[0]++;
    seen[1] ^= key;
}

/* 200,000 rows through many rehashes: every one found, `each` visits each
 * once in creation order, memory counted close to what the rows take. */
static void test_growth(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 32);
    ps_hp hp = hp1(PS_HP_LR, 1.0);
    ps_table_def d = def("big", 2, "zeros", 0, "sgd", &hp);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    enum { N = 200000, B = 4096 };
    static uint8_t kb[B * 8];
    static float g[B * 2];
    uint64_t x = 0;
    for (uint32_t base = 0; base < N; base += B) {
        uint64_t k[B];
        for (uint32_t i = 0; i < B && base + i < N; i++) {
            k[i] = (uint64_t)(base + i) * 0x100000001b3ull; /* keys with low bits alike */
            g[2 * i] = -(float)(k[i] % 1000);
            g[2 * i + 1] = 1.0f;
            x ^= k[i];
        }
        uint32_t n = base + B <= N ? B : N - base;
        keys_le(kb, k, n);
        assert_int_equal(srv_tables_push(&ts, ti, kb, n, g, 1.0, err, sizeof err), 0);
    }
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, N);
    for (uint32_t i = 0; i < N; i += 997) {
        const float *row = srv_tables_row(&ts, ti, (uint64_t)i * 0x100000001b3ull);
        assert_non_null(row);
        assert_true(row[1] == -1.0f);
    }
    assert_null(srv_tables_row(&ts, ti, 3));
    uint64_t seen[2] = {0, 0};
    srv_tables_each(&ts, ti, count_row, seen);
    assert_int_equal(seen[0], N);
    assert_true(seen[1] == x);
    /* 16 bytes of row (key and two floats; no clock: no expiry, no
     * eviction) and 4 per slot at a load between 5/16 and 5/8: between 22.4
     * and 28.8 bytes a row, plus the last block */
    double per_row = (double)st.bytes / N;
    if (per_row < 22 || per_row > 31)
        fail_msg("%.1f bytes a row", per_row);
    srv_tables_free(&ts);
}

/* ---- bounds: admission, expiry, caps with eviction ------------------------------- */

/* Pushes key k alone with gradient value v (dim 4). */
static int push1(srv_tables *ts, uint32_t ti, uint64_t k, float v)
{
    uint8_t kb[8];
    keys_le(kb, &k, 1);
    const float g[4] = {v, v, v, v};
    return srv_tables_push(ts, ti, kb, 1, g, 1.0, err, sizeof err);
}

/* Every stored row found by its key, each key once: the slots and the rows
 * agree after removals. Returns the rows seen. */
static void check_row(uint64_t key, const float *row, void *arg)
{
    const srv_tables *ts = ((const void **)arg)[0];
    uint64_t *n = ((void **)arg)[1];
    assert_ptr_equal(srv_tables_row(ts, 0, key), row);
    (*n)++;
}

static uint64_t check_rows(srv_tables *ts)
{
    uint64_t n = 0;
    void *arg[2] = {ts, &n};
    srv_tables_each(ts, 0, check_row, arg);
    srv_table_stats st;
    srv_tables_stats(ts, 0, &st);
    assert_int_equal(n, st.rows);
    return n;
}

/* The admission tests' set-up: starts *ts (1 GiB) with a key admitted at
 * its admit-th push and declares one table "e" of dim 4 with SGD, its rows
 * made by rinit (scale); returns the table's index and its definition in
 * *d. The caller frees *ts. */
static uint32_t admit_table(srv_tables *ts, uint32_t admit, const char *rinit, double scale, ps_table_def *d)
{
    srv_tables_init(ts, 1ull << 30);
    srv_table_bounds b = {.admit = admit};
    srv_tables_set_bounds(ts, &b);
    *d = def("e", 4, rinit, scale, "sgd", NULL);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(ts, d, &ti, err, sizeof err), 0);
    return ti;
}

/* Admission at the 3rd push: before it, pulls answer the initial row and
 * pushes are counted, not stored; the 3rd stores the row with its own
 * gradient applied; the counters take 1 MiB, counted. */
static void test_admission(void **state)
{
    (void)state;
    srv_tables ts;
    ps_table_def d;
    uint32_t ti = admit_table(&ts, 3, "uniform", 0.05, &d);
    uint64_t before = ts.bytes;
    float init[4], out[4];
    ps_table_row_init(&d, 7, init);
    uint8_t kb[8];
    uint64_t k7 = 7;
    keys_le(kb, &k7, 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(push1(&ts, ti, 7, 1.0f), 0);
        assert_null(srv_tables_row(&ts, ti, 7));
        srv_tables_pull(&ts, ti, kb, 1, out);
        assert_memory_equal(out, init, sizeof init);
    }
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.filtered, 2);
    assert_int_equal(st.admitted, 0);
    assert_int_equal(ts.bytes, before + 4 * 262144);
    assert_int_equal(push1(&ts, ti, 7, 2.0f), 0);
    const float *row = srv_tables_row(&ts, ti, 7);
    assert_non_null(row);
    for (int j = 0; j < 4; j++)
        assert_true(row[j] == (float)((double)init[j] - 0.01 * 2.0)); /* the first two pushes dropped */
    assert_int_equal(push1(&ts, ti, 7, 1.0f), 0);                    /* stored: applied */
    assert_true(srv_tables_row(&ts, ti, 7)[0] == (float)((double)(float)((double)init[0] - 0.02) - 0.01));
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.admitted, 1);
    assert_int_equal(st.filtered, 2);
    assert_int_equal(st.rows_pushed, 2);
    /* 1000 keys pushed twice each: none stored; a third time: all */
    for (int round = 0; round < 3; round++)
        for (uint64_t k = 100; k < 1100; k++)
            assert_int_equal(push1(&ts, ti, k, 0.5f), 0);
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 1001);
    assert_int_equal(st.admitted, 1001);
    assert_true(st.bytes > 4 * 262144 + 1001 * 24); /* the counters stay counted as rows come */
    assert_int_equal(st.bytes, ts.bytes);
    check_rows(&ts);
    srv_tables_free(&ts);
}

/* Pushes keys first..first+n-1 once each (dim 4), in pushes of 4096. */
static void push_range(srv_tables *ts, uint32_t ti, uint64_t first, uint64_t n)
{
    enum { B = 4096 };
    static uint8_t kb[B * 8];
    static float g[B * 4];
    for (size_t i = 0; i < B * 4; i++)
        g[i] = 0.25f;
    for (uint64_t done = 0; done < n;) {
        uint32_t m = n - done < B ? (uint32_t)(n - done) : B;
        uint64_t k[B];
        for (uint32_t i = 0; i < m; i++)
            k[i] = first + done + i;
        keys_le(kb, k, m);
        assert_int_equal(srv_tables_push(ts, ti, kb, m, g, 1.0, err, sizeof err), 0);
        done += m;
    }
}

/* Admission's counts age (they halve every 262,144 counted pushes): a key
 * pushed once and then not for a long while needs its N pushes anew; on a
 * long stream of keys each pushed once, new keys are still filtered at
 * their first push (before the ageing, once some 10^6 keys were counted
 * every counter was above zero and every key was stored at its first). */
static void test_admission_ages(void **state)
{
    (void)state;
    enum { AGE = 262144 };
    srv_tables ts;
    ps_table_def d;
    uint32_t ti = admit_table(&ts, 2, "zeros", 0, &d);
    srv_table_stats st;
    /* soon after: the second push stores it */
    assert_int_equal(push1(&ts, ti, 7, 1.0f), 0);
    assert_int_equal(push1(&ts, ti, 7, 1.0f), 0);
    assert_non_null(srv_tables_row(&ts, ti, 7));
    /* key 8 once, then 2 x AGE pushes of other keys: two halvings */
    assert_int_equal(push1(&ts, ti, 8, 1.0f), 0);
    push_range(&ts, ti, 1000000, 2 * AGE);
    srv_tables_stats(&ts, ti, &st);
    uint64_t rows = st.rows; /* of those 2 x AGE keys, admitted at their first push */
    assert_int_equal(push1(&ts, ti, 8, 1.0f), 0);
    assert_null(srv_tables_row(&ts, ti, 8)); /* its first count is gone */
    assert_int_equal(push1(&ts, ti, 8, 1.0f), 0);
    assert_non_null(srv_tables_row(&ts, ti, 8));
    /* 3 x 10^6 more keys, each once: the last 65,536 are mostly filtered */
    push_range(&ts, ti, 10000000, 3000000);
    srv_tables_stats(&ts, ti, &st);
    uint64_t before = st.rows;
    push_range(&ts, ti, 20000000, 65536);
    srv_tables_stats(&ts, ti, &st);
    uint64_t early = st.rows - before; /* admitted at their first push: collisions */
    print_message("admitted at their first push: %llu of the first %d keys, %llu of 65,536 after 3 x 10^6\n",
                  (unsigned long long)rows, 2 * AGE, (unsigned long long)early);
    assert_true(rows < 2 * AGE / 10);
    assert_true(early < 65536 / 10);
    check_rows(&ts);
    srv_tables_free(&ts);
}

/* Expiry after 3 pushes to the table: a row not pushed in the last 3 goes
 * at the 4th; the rows and slots stay consistent; on a random run of
 * pushes, exactly the rows a reference says are fresh are stored (a table
 * under 1024 rows: every push's scan sees all of them). */
static void test_expiry(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    srv_table_bounds b = {.expire = 3};
    srv_tables_set_bounds(&ts, &b);
    ps_table_def d = def("e", 4, "zeros", 0, "sgd", NULL);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    assert_int_equal(push1(&ts, ti, 1, 1.0f), 0); /* clock 1 */
    assert_int_equal(push1(&ts, ti, 2, 1.0f), 0); /* 2 */
    assert_int_equal(push1(&ts, ti, 9, 1.0f), 0); /* 3 */
    assert_int_equal(push1(&ts, ti, 9, 1.0f), 0); /* 4: key 1 untouched for 3: kept */
    assert_non_null(srv_tables_row(&ts, ti, 1));
    assert_int_equal(push1(&ts, ti, 9, 1.0f), 0); /* 5: key 1 goes */
    assert_null(srv_tables_row(&ts, ti, 1));
    assert_non_null(srv_tables_row(&ts, ti, 2));
    assert_int_equal(push1(&ts, ti, 9, 1.0f), 0); /* 6: key 2 goes */
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.expired, 2);
    assert_int_equal(st.rows, 1);
    assert_int_equal(check_rows(&ts), 1);
    /* a random run against a reference */
    static uint64_t last[600]; /* the clock of each key's last push; 0: none */
    memset(last, 0, sizeof last);
    uint64_t clock = 6;
    last[9] = 6;
    b.expire = 40;
    srv_tables_set_bounds(&ts, &b);
    for (int p = 0; p < 3000; p++) {
        uint64_t k[8];
        uint8_t kb[64];
        float g[32];
        uint32_t n = (uint32_t)(rnd() % 8) + 1;
        for (uint32_t i = 0; i < n; i++) {
            int again;
            do {
                k[i] = rnd() % 600;
                again = 0;
                for (uint32_t j = 0; j < i; j++)
                    again |= k[j] == k[i];
            } while (again);
            g[4 * i] = g[4 * i + 1] = g[4 * i + 2] = g[4 * i + 3] = 0.1f;
        }
        keys_le(kb, k, n);
        clock++;
        assert_int_equal(srv_tables_push(&ts, ti, kb, n, g, 1.0, err, sizeof err), 0);
        for (uint32_t i = 0; i < n; i++)
            last[k[i]] = clock;
        uint64_t fresh = 0;
        for (uint64_t key = 0; key < 600; key++) {
            int want = last[key] && clock - last[key] <= 40;
            /* a row past its time goes at the next push's scan */
            if (last[key] && clock - last[key] == 41)
                want = 1;
            if (want != (srv_tables_row(&ts, ti, key) != NULL) && !(last[key] && clock - last[key] > 40))
                fail_msg("push %d: key %llu (last pushed at %llu, now %llu) %s", p, (unsigned long long)key,
                         (unsigned long long)last[key], (unsigned long long)clock, want ? "gone" : "stored");
            fresh += last[key] && clock - last[key] <= 40;
        }
        uint64_t stored = check_rows(&ts);
        if (stored != fresh)
            fail_msg("push %d: %llu rows stored, %llu pushed in the last 40", p, (unsigned long long)stored,
                     (unsigned long long)fresh);
    }
    srv_tables_stats(&ts, ti, &st);
    assert_true(st.expired > 1000);
    srv_tables_free(&ts);
}

/* srv_tables_each_stamp gives each row's last-push clock; loading the
 * rows with those stamps and the table's clock into another store makes
 * expiry drop the same rows at the same pushes; a stamp past the table's
 * clock is refused, naming the key. */
static void collect_key(uint64_t key, const float *row, void *arg)
{
    (void)row;
    uint64_t **p = arg;
    *(*p)++ = key;
}

static void collect_stamp(uint64_t stamp, void *arg)
{
    uint64_t **p = arg;
    *(*p)++ = stamp;
}

static void test_stamps_survive_reload(void **state)
{
    (void)state;
    srv_tables a, c;
    srv_tables_init(&a, 1ull << 30);
    srv_tables_init(&c, 1ull << 30);
    srv_table_bounds b = {.expire = 3};
    srv_tables_set_bounds(&a, &b);
    srv_tables_set_bounds(&c, &b);
    ps_table_def d = def("e", 4, "zeros", 0, "sgd", NULL);
    uint32_t ti, tc;
    assert_int_equal(srv_tables_declare(&a, &d, &ti, err, sizeof err), 0);
    assert_int_equal(push1(&a, ti, 1, 1.0f), 0); /* clock 1 */
    assert_int_equal(push1(&a, ti, 2, 1.0f), 0); /* 2 */
    assert_int_equal(push1(&a, ti, 2, 1.0f), 0); /* 3 */
    srv_table_stats st;
    srv_tables_stats(&a, ti, &st);
    assert_int_equal(st.clock, 3);
    uint64_t keys[2], stamps[2], *kp = keys, *sp = stamps;
    srv_tables_each(&a, ti, collect_key, &kp);
    srv_tables_each_stamp(&a, ti, collect_stamp, &sp);
    assert_int_equal(kp - keys, 2);
    assert_int_equal(sp - stamps, 2);
    assert_int_equal(keys[0], 1);
    assert_int_equal(stamps[0], 1);
    assert_int_equal(stamps[1], 3);
    uint8_t kb[16], sb[16], rows[2 * 4 * sizeof(float)];
    keys_le(kb, keys, 2);
    keys_le(sb, stamps, 2);
    memcpy(rows, srv_tables_row(&a, ti, 1), 4 * sizeof(float));
    memcpy(rows + 4 * sizeof(float), srv_tables_row(&a, ti, 2), 4 * sizeof(float));
    assert_int_equal(srv_tables_declare(&c, &d, &tc, err, sizeof err), 0);
    srv_tables_set_clock(&c, tc, st.clock);
    assert_int_equal(srv_tables_load(&c, tc, kb, rows, sb, 2, err, sizeof err), 0);
    assert_int_equal(push1(&c, tc, 2, 1.0f), 0); /* 4: key 1 untouched for 3: kept */
    assert_non_null(srv_tables_row(&c, tc, 1));
    assert_int_equal(push1(&c, tc, 2, 1.0f), 0); /* 5: key 1 goes, as in a store never reloaded */
    assert_null(srv_tables_row(&c, tc, 1));
    assert_non_null(srv_tables_row(&c, tc, 2));
    srv_tables_free(&c);
    /* a row pushed after the table's clock: malformed */
    srv_tables_init(&c, 1ull << 30);
    assert_int_equal(srv_tables_declare(&c, &d, &tc, err, sizeof err), 0);
    srv_tables_set_clock(&c, tc, 2);
    assert_int_equal(srv_tables_load(&c, tc, kb, rows, sb, 2, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "key 2 last pushed at clock 3, past the table's clock 2"));
    srv_tables_free(&c);
    srv_tables_free(&a);
}

/* table_memory with table_full = evict: pushes of ever new keys never take
 * the table past the cap nor fail; a hot set pushed every time stays (the
 * least recently pushed go); with refuse the same push is LIMIT and
 * changes nothing; a push with more new rows than the cap holds is LIMIT
 * either way; max_table_memory evicts the same way; a cap smaller than a
 * table's first row is refused at the declaration. */
static void test_eviction(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    srv_table_bounds b = {.table_bytes = 400000, .full = PS_TABLE_FULL_EVICT};
    srv_tables_set_bounds(&ts, &b);
    ps_table_def d = def("e", 4, "zeros", 0, "sgd", NULL);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    static uint64_t k[200];
    static uint8_t kb[200 * 8];
    static float g[200 * 4];
    for (int i = 0; i < 200 * 4; i++)
        g[i] = 1.0f;
    uint64_t next = 1000;
    srv_table_stats st;
    for (int p = 0; p < 300; p++) {
        for (int i = 0; i < 10; i++)
            k[i] = (uint64_t)i; /* hot */
        for (int i = 10; i < 100; i++)
            k[i] = next++;
        keys_le(kb, k, 100);
        assert_int_equal(srv_tables_push(&ts, ti, kb, 100, g, 1.0, err, sizeof err), 0);
        srv_tables_stats(&ts, ti, &st);
        assert_true(st.bytes <= 400000);
        assert_true(ts.bytes <= 400000); /* the table alone */
        for (int i = 0; i < 100; i++)
            assert_non_null(srv_tables_row(&ts, ti, k[i]));
    }
    for (uint64_t h = 0; h < 10; h++)
        assert_true(srv_tables_row(&ts, ti, h)[0] == -0.01f * 300 || fabsf(srv_tables_row(&ts, ti, h)[0] + 3.0f) < 1e-4f);
    assert_int_equal(st.evicted + st.rows, 10 + 90 * 300);
    assert_true(st.evicted > 18000); /* at most 8,192 rows (a block, its clocks and 2^14 slots) fit */
    uint64_t rows = check_rows(&ts);
    /* the rows kept are the most recently pushed, give or take the sample:
     * most of them were pushed in the last few pushes */
    assert_true(rows > 1000);
    /* refuse: LIMIT, nothing changed (expiry on but far off keeps the
     * rows' clocks for the evictions after) */
    b.full = PS_TABLE_FULL_REFUSE;
    b.expire = 1000000;
    srv_tables_set_bounds(&ts, &b);
    for (int i = 0; i < 100; i++)
        k[i] = next++;
    keys_le(kb, k, 100);
    uint64_t stamp = ts.stamp;
    assert_int_equal(srv_tables_push(&ts, ti, kb, 100, g, 1.0, err, sizeof err), PS_ELIMIT);
    assert_has(err, "past table_memory (400000 bytes");
    assert_has(err, "table_full = refuse");
    assert_int_equal(ts.stamp, stamp);
    assert_int_equal(check_rows(&ts), rows);
    assert_null(srv_tables_row(&ts, ti, k[0]));
    /* more new rows in one push than the cap holds: LIMIT with evict too */
    b.full = PS_TABLE_FULL_EVICT;
    b.table_bytes = 40000;
    srv_tables_set_bounds(&ts, &b);
    assert_int_equal(srv_tables_push(&ts, ti, kb, 100, g, 1.0, err, sizeof err), PS_ELIMIT);
    assert_has(err, "evicting every row this push does not touch would not make room");
    /* max_table_memory evicts the same way */
    b.table_bytes = 0;
    srv_tables_set_bounds(&ts, &b);
    srv_tables_set_limit(&ts, 400000);
    for (int p = 0; p < 20; p++) {
        for (int i = 0; i < 100; i++)
            k[i] = next++;
        keys_le(kb, k, 100);
        assert_int_equal(srv_tables_push(&ts, ti, kb, 100, g, 1.0, err, sizeof err), 0);
        assert_true(ts.bytes <= 400000);
    }
    check_rows(&ts);
    /* a cap smaller than the first row */
    b.table_bytes = 1000;
    srv_tables_set_bounds(&ts, &b);
    ps_table_def d2 = def("f", 4, "zeros", 0, "sgd", NULL);
    uint32_t t2;
    assert_int_equal(srv_tables_declare(&ts, &d2, &t2, err, sizeof err), PS_ELIMIT);
    assert_has(err, "table 'f': table_memory (1000 bytes) is smaller than the table's first row takes");
    assert_int_equal(ts.n, 1);
    srv_tables_free(&ts);
}

/* max_table_memory: a push whose new rows would pass it is refused whole;
 * one that updates stored rows only still goes through; the limit counts
 * every table together. */
static void test_memory_limit(void **state)
{
    (void)state;
    ps_table_def d = def("e", 16, "uniform", 0.05, "adagrad", NULL);
    uint64_t row = srv_table_row_bytes(&d);
    assert_int_equal(row, (uint64_t)(16 * 2 + 2) * 4 + 7); /* 136 (key, values, state) + 4 x 8 / 5 rounded up */
    srv_tables ts;
    /* a table's first rows take a block of 1024 rows of 136 bytes and 1024
     * slots of 4 bytes, about 143 KB: one table's fit, two tables' or two
     * blocks do not */
    srv_tables_init(&ts, 250u << 10);
    uint32_t a, b;
    assert_int_equal(srv_tables_declare(&ts, &d, &a, err, sizeof err), 0);
    ps_table_def d2 = def("f", 16, "uniform", 0.05, "adagrad", NULL);
    assert_int_equal(srv_tables_declare(&ts, &d2, &b, err, sizeof err), 0);

    static uint8_t kb[1025 * 8];
    static float g[1025 * 16];
    for (int i = 0; i < 1025 * 16; i++)
        g[i] = 0.5f;
    static uint64_t k[1025];
    for (int i = 0; i < 640; i++)
        k[i] = (uint64_t)i;
    keys_le(kb, k, 640);
    assert_int_equal(srv_tables_push(&ts, a, kb, 640, g, 1.0, err, sizeof err), 0);
    uint64_t used = ts.bytes;
    /* table f's first block would pass the limit */
    assert_int_equal(srv_tables_push(&ts, b, kb, 1, g, 1.0, err, sizeof err), PS_ELIMIT);
    assert_has(err, "table 'f': 1 new rows would take psd's tables to");
    assert_has(err, "past max_table_memory (256000 bytes");
    srv_table_stats st;
    srv_tables_stats(&ts, b, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(ts.bytes, used);
    /* table e: 640 rows stored, 385 more need a second block: refused,
     * nothing changed */
    float before[16];
    memcpy(before, srv_tables_row(&ts, a, 5), sizeof before);
    for (int i = 0; i < 1025; i++)
        k[i] = (uint64_t)i;
    keys_le(kb, k, 1025);
    int rc = srv_tables_push(&ts, a, kb, 1025, g, 1.0, err, sizeof err);
    assert_int_equal(rc, PS_ELIMIT);
    srv_tables_stats(&ts, a, &st);
    assert_int_equal(st.rows, 640);
    assert_memory_equal(srv_tables_row(&ts, a, 5), before, sizeof before);
    /* stored rows only: fine */
    assert_int_equal(srv_tables_push(&ts, a, kb, 640, g, 1.0, err, sizeof err), 0);
    assert_memory_not_equal(srv_tables_row(&ts, a, 5), before, sizeof before);
    assert_int_equal(ts.bytes, used);
    srv_tables_free(&ts);
}

/* An update that would overflow changes nothing, not even the other rows
 * of the push or the rows it would have created. */
static void test_nonfinite_update_changes_nothing(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_hp hp = hp1(PS_HP_LR, 1.0);
    ps_table_def d = def("e", 2, "zeros", 0, "sgd", &hp);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    uint64_t k[3] = {1, 2, 3};
    uint8_t kb[24];
    keys_le(kb, k, 3);
    const float big[6] = {-3e38f, 0, 1, 1, 1, 1};
    assert_int_equal(srv_tables_push(&ts, ti, kb, 1, big, 1.0, err, sizeof err), 0); /* row 1 at 3e38 */
    uint64_t bytes = ts.bytes;
    assert_int_equal(srv_tables_push(&ts, ti, kb, 3, big, 1.0, err, sizeof err), PS_ENONFINITE);
    assert_has(err, "key 1 would make its row");
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.rows_pushed, 1);
    assert_true(srv_tables_row(&ts, ti, 1)[0] == 3e38f);
    assert_null(srv_tables_row(&ts, ti, 2));
    assert_int_equal(ts.bytes, bytes);
    srv_tables_free(&ts);
}

/* The rows a push steps in place before one of its later keys fails (a
 * step not finite; new rows past max_table_memory) are put back bit for
 * bit: the push changes nothing, and the next push steps the old rows. */
static void test_push_failure_restores_rows(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_hp hp = hp1(PS_HP_LR, 1.0);
    ps_table_def d = def("e", 2, "uniform", 0.5, "adagrad", &hp);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    enum { N = 300 };
    static uint64_t k[N + 1];
    static uint8_t kb[(N + 1) * 8];
    static float g[(N + 1) * 2], was[N][4];
    for (int i = 0; i <= N; i++)
        k[i] = 1000 + (uint64_t)i * 7919;
    keys_le(kb, k, N + 1);
    for (int i = 0; i < 2 * (N + 1); i++)
        g[i] = 0.25f * (float)(i % 7) - 0.5f;
    assert_int_equal(srv_tables_push(&ts, ti, kb, N, g, 1.0, err, sizeof err), 0);
    for (int i = 0; i < N; i++)
        memcpy(was[i], srv_tables_row(&ts, ti, k[i]), sizeof was[i]);
    /* the last key's accumulator overflows: NONFINITE, rows as they were */
    g[2 * (N - 1)] = 3e38f;
    uint64_t stamp = ts.stamp;
    assert_int_equal(srv_tables_push(&ts, ti, kb, N, g, 1.0, err, sizeof err), PS_ENONFINITE);
    assert_int_equal(ts.stamp, stamp);
    for (int i = 0; i < N; i++)
        if (memcmp(was[i], srv_tables_row(&ts, ti, k[i]), sizeof was[i]) != 0)
            fail_msg("NONFINITE: row %d changed", i);
    /* a new row (amid the stored ones) past max_table_memory: LIMIT, rows
     * as they were */
    g[2 * (N - 1)] = 0.5f;
    static uint64_t k2[N + 1];
    static uint8_t kb2[(N + 1) * 8];
    memcpy(k2, k, sizeof k2);
    k2[N / 2] = k[N];
    k2[N] = k[N / 2];
    keys_le(kb2, k2, N + 1);
    srv_tables_set_limit(&ts, ts.bytes - 1); /* no room for one more row, whatever it takes */
    assert_int_equal(srv_tables_push(&ts, ti, kb2, N + 1, g, 1.0, err, sizeof err), PS_ELIMIT);
    assert_has(err, "past max_table_memory");
    assert_int_equal(ts.stamp, stamp);
    for (int i = 0; i < N; i++)
        if (memcmp(was[i], srv_tables_row(&ts, ti, k[i]), sizeof was[i]) != 0)
            fail_msg("LIMIT: row %d changed", i);
    assert_null(srv_tables_row(&ts, ti, k[N]));
    /* and the next push steps the rows from there */
    assert_int_equal(srv_tables_push(&ts, ti, kb, N, g, 1.0, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        float want[4];
        memcpy(want, was[i], sizeof want);
        assert_true(srv_sparse_step(&d, want, g + 2 * i, 1.0));
        if (memcmp(want, srv_tables_row(&ts, ti, k[i]), sizeof want) != 0)
            fail_msg("row %d: not one step from where it was", i);
    }
    srv_tables_free(&ts);
}

/* A push of rows of a dim the step checks once for all the rows (16, with
 * AdaGrad), whose steps are not all finite: every row, stored or new, is
 * as it was, and the error names the first key whose step is not, though
 * the rows after it were stepped before the check. */
static void test_push_failure_names_first_key(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_hp hp = hp1(PS_HP_LR, 1.0);
    ps_table_def d = def("e", 16, "uniform", 0.5, "adagrad", &hp);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    enum { N = 200, DIM = 16 };
    static uint64_t k[N];
    static uint8_t kb[N * 8];
    static float g[N * DIM], was[N][2 * DIM];
    for (int i = 0; i < N; i++)
        k[i] = 5000 + (uint64_t)i * 104729;
    keys_le(kb, k, N);
    for (int i = 0; i < N * DIM; i++)
        g[i] = 0.125f * (float)(i % 9) - 0.5f;
    /* the even keys stored, the odd ones new to the next pushes */
    static uint8_t even[N / 2 * 8];
    static float geven[N / 2 * DIM];
    for (int i = 0; i < N / 2; i++) {
        memcpy(even + 8 * i, kb + 8 * (2 * i), 8);
        memcpy(geven + DIM * i, g + DIM * (2 * i), sizeof(float) * DIM);
    }
    assert_int_equal(srv_tables_push(&ts, ti, even, N / 2, geven, 1.0, err, sizeof err), 0);
    for (int i = 0; i < N; i += 2)
        memcpy(was[i], srv_tables_row(&ts, ti, k[i]), sizeof was[i]);
    srv_table_stats st0;
    srv_tables_stats(&ts, ti, &st0);
    /* bad at key 120 (stored) and key 51 (new): 51 is named; then at key
     * 120 alone: 120 */
    static const int first[2] = {51, 120};
    for (int c = 0; c < 2; c++) {
        float keep51 = g[51 * DIM + 3], keep120 = g[120 * DIM + 5];
        if (c == 0)
            g[51 * DIM + 3] = NAN;
        g[120 * DIM + 5] = INFINITY;
        assert_int_equal(srv_tables_push(&ts, ti, kb, N, g, 1.0, err, sizeof err), PS_ENONFINITE);
        char want[64];
        snprintf(want, sizeof want, "key %llu would make", (unsigned long long)k[first[c]]);
        assert_has(err, want);
        srv_table_stats st;
        srv_tables_stats(&ts, ti, &st);
        assert_int_equal(st.rows, st0.rows);
        assert_int_equal(st.rows_pushed, st0.rows_pushed);
        for (int i = 0; i < N; i++)
            if (i % 2 == 0 ? memcmp(was[i], srv_tables_row(&ts, ti, k[i]), sizeof was[i]) != 0
                           : srv_tables_row(&ts, ti, k[i]) != NULL)
                fail_msg("case %d: key %d changed", c, i);
        g[51 * DIM + 3] = keep51;
        g[120 * DIM + 5] = keep120;
    }
    /* the same push, finite: every row one step on, the new ones made */
    assert_int_equal(srv_tables_push(&ts, ti, kb, N, g, 1.0, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        float want[2 * DIM];
        if (i % 2 == 0)
            memcpy(want, was[i], sizeof want);
        else
            srv_sparse_row_new(&d, k[i], want);
        assert_true(srv_sparse_step(&d, want, g + DIM * i, 1.0));
        if (memcmp(want, srv_tables_row(&ts, ti, k[i]), sizeof want) != 0)
            fail_msg("key %d: not one step from where it was", i);
    }
    srv_tables_free(&ts);
}

static void test_declare(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 20);
    ps_table_def d = def("e", 4, "uniform", 0.05, "sgd", NULL);
    uint32_t i, j;
    assert_int_equal(srv_tables_declare(&ts, &d, &i, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&ts, &d, &j, err, sizeof err), 0);
    assert_int_equal(i, j);
    assert_int_equal(ts.n, 1);
    ps_table_def other = def("e", 8, "uniform", 0.05, "sgd", NULL);
    assert_int_equal(srv_tables_declare(&ts, &other, &j, err, sizeof err), PS_ELAYOUT);
    assert_has(err, "table 'e' declared as dim 8, uniform(0.05), seed 11, sgd lr 0.01, but psd holds it as dim 4");
    assert_int_equal(srv_tables_find(&ts, "e"), 0);
    assert_int_equal(srv_tables_find(&ts, "x"), -1);
    for (int n = 1; n < PS_TABLES_MAX; n++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", n);
        ps_table_def t = def(name, 1, "zeros", 0, "sgd", NULL);
        assert_int_equal(srv_tables_declare(&ts, &t, &j, err, sizeof err), 0);
        assert_int_equal(j, (uint32_t)n);
    }
    ps_table_def t = def("one_more", 1, "zeros", 0, "sgd", NULL);
    assert_int_equal(srv_tables_declare(&ts, &t, &j, err, sizeof err), PS_ELIMIT);
    assert_has(err, "psd holds 64 tables already");
    assert_string_equal(srv_tables_def(&ts, 3)->name, "t3");
    srv_tables_free(&ts);
}

/* A push through its connection's hint (srv_row_hint: where the last pull
 * found its rows) equals the same push without one, bit for bit, while the
 * rows move under the hint between the pull and the push: rows expire or
 * are evicted (the last row takes a removed one's place, in another push
 * and in the push's own expiry scan or eviction), keys not stored at the
 * pull are stored by another push meanwhile, the next push carries other
 * keys, or the same keys in another order. Store a is hinted, store b is
 * not; n keys a push of `space`, over `rounds` rounds. */
static void hint_run(const srv_table_bounds *bd, uint64_t space, uint32_t n, int rounds)
{
    ps_hp hp = hp1(PS_HP_LR, 0.1);
    ps_table_def d = def("e", 4, "uniform", 0.5, "adagrad", &hp), d2 = def("f", 4, "uniform", 0.5, "sgd", &hp);
    srv_tables a, b;
    uint32_t ta, tb, fa, fb;
    srv_tables_init(&a, 1ull << 30);
    srv_tables_init(&b, 1ull << 30);
    srv_tables_set_bounds(&a, bd);
    srv_tables_set_bounds(&b, bd);
    assert_int_equal(srv_tables_declare(&a, &d, &ta, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&b, &d, &tb, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&a, &d2, &fa, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&b, &d2, &fb, err, sizeof err), 0);
    srv_row_hint h = {0};
    uint64_t xs = 0x9e3779b97f4a7c15ull, hinted_pushes = 0;
    uint64_t *k = malloc(8 * n), *q = malloc(8 * n), *all = malloc(8 * space);
    uint8_t *kb = malloc(8 * n), *qb = malloc(8 * n), *ab = malloc(8 * space);
    float *ra = malloc(sizeof(float) * 4 * space), *rb = malloc(sizeof(float) * 4 * space);
    float *g = malloc(sizeof(float) * 4 * n);
    uint8_t *seen = calloc(space, 1);
    assert_true(k && q && all && kb && qb && ab && ra && rb && g && seen);
    for (int step = 0; step < rounds; step++) {
        /* n distinct keys of space, twice */
        for (int which = 0; which < 2; which++) {
            uint64_t *out = which ? q : k;
            memset(seen, 0, space);
            for (uint32_t m = 0; m < n;) {
                xs ^= xs << 13, xs ^= xs >> 7, xs ^= xs << 17;
                uint64_t r = xs % space;
                if (seen[r])
                    continue;
                seen[r] = 1;
                out[m++] = r * 0x100000001b3ull + 1;
            }
        }
        keys_le(kb, k, n);
        keys_le(qb, q, n);
        srv_tables_pull_hint(&a, ta, kb, n, ra, &h);
        srv_tables_pull(&b, tb, kb, n, rb);
        assert_memory_equal(ra, rb, sizeof(float) * n * 4);
        assert_int_equal(h.n, n);
        for (uint32_t j = 0; j < n * 4; j++)
            g[j] = (float)(0.01 * ((step * 31 + j * 7) % 13) - 0.06);
        switch (step % 5) {
        case 1: /* another push first: stores keys, removes and moves rows */
            assert_int_equal(srv_tables_push(&a, ta, qb, n, g, 1.0, err, sizeof err), 0);
            assert_int_equal(srv_tables_push(&b, tb, qb, n, g, 1.0, err, sizeof err), 0);
            break;
        case 2: /* the pulled keys in another order: the hint is not theirs */
            for (int m = 0; m < 8; m++) {
                uint8_t t = kb[m];
                kb[m] = kb[8 * (n - 1) + m];
                kb[8 * (n - 1) + m] = t;
            }
            break;
        case 3: /* other keys */
            memcpy(kb, qb, 8 * (size_t)n);
            break;
        case 4: /* the same keys to another table */
            assert_int_equal(srv_tables_push_hint(&a, fa, kb, n, g, 1.0, &h, err, sizeof err), 0);
            assert_int_equal(srv_tables_push(&b, fb, kb, n, g, 1.0, err, sizeof err), 0);
            break;
        default:
            hinted_pushes++;
        }
        assert_int_equal(srv_tables_push_hint(&a, ta, kb, n, g, 1.0, &h, err, sizeof err), 0);
        assert_int_equal(srv_tables_push(&b, tb, kb, n, g, 1.0, err, sizeof err), 0);
        srv_table_stats sa, sb;
        srv_tables_stats(&a, ta, &sa);
        srv_tables_stats(&b, tb, &sb);
        assert_int_equal(sa.rows, sb.rows);
        assert_int_equal(sa.expired, sb.expired);
        assert_int_equal(sa.evicted, sb.evicted);
    }
    assert_true(hinted_pushes > (uint64_t)rounds / 8);
    /* every key's row alike, in both tables */
    for (uint64_t i = 0; i < space; i++)
        all[i] = i * 0x100000001b3ull + 1;
    keys_le(ab, all, space);
    for (int t = 0; t < 2; t++) {
        srv_tables_pull(&a, t ? fa : ta, ab, (uint32_t)space, ra);
        srv_tables_pull(&b, t ? fb : tb, ab, (uint32_t)space, rb);
        assert_memory_equal(ra, rb, sizeof(float) * 4 * space);
    }
    srv_table_stats sa;
    srv_tables_stats(&a, ta, &sa);
    assert_true(sa.expired + sa.evicted > 0 && sa.rows > 0); /* rows did move */
    srv_row_hint_free(&h);
    srv_tables_free(&a);
    srv_tables_free(&b);
    free(k), free(q), free(all), free(kb), free(qb), free(ab), free(ra), free(rb), free(g), free(seen);
}

static void test_row_hints_are_only_guesses(void **state)
{
    (void)state;
    srv_table_bounds expiry = {.expire = 6}, eviction = {.table_bytes = 400000, .full = PS_TABLE_FULL_EVICT};
    hint_run(&expiry, 48, 8, 400);
    hint_run(&eviction, 20000, 512, 200); /* about 8,192 rows fit */
}

static void test_first_dup(void **state)
{
    (void)state;
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 20);
    static uint64_t k[5000];
    static uint8_t kb[5000 * 8];
    for (int i = 0; i < 5000; i++)
        k[i] = (uint64_t)i << 40; /* low bits alike */
    keys_le(kb, k, 5000);
    uint32_t a = 9, b = 9;
    assert_int_equal(srv_tables_first_dup(&ts, kb, 5000, &a, &b), 0);
    k[4321] = k[17];
    keys_le(kb, k, 5000);
    assert_int_equal(srv_tables_first_dup(&ts, kb, 5000, &a, &b), 1);
    assert_int_equal(a, 17);
    assert_int_equal(b, 4321);
    uint64_t two[2] = {UINT64_MAX, UINT64_MAX};
    keys_le(kb, two, 2);
    assert_int_equal(srv_tables_first_dup(&ts, kb, 2, &a, &b), 1);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(srv_tables_first_dup(&ts, kb, 1, &a, &b), 0);
    srv_tables_free(&ts);
}

/* srv_tables_first_dup_hint against srv_tables_first_dup: pulls of keys
 * with and without repeats (and with keys not stored), each followed by
 * the duplicate check of the same keys through the pull's hint, sometimes
 * after another push stored keys and evicted and moved rows, sometimes
 * with the hint of other keys: the same answer (and positions) every
 * time, the bits all clear after each call, and the bits used. */
static void test_first_dup_hint(void **state)
{
    (void)state;
    enum { SPACE = 3000, N = 300, ROUNDS = 400 };
    ps_hp hp = hp1(PS_HP_LR, 0.1);
    ps_table_def d = def("e", 4, "uniform", 0.5, "adagrad", &hp);
    /* about 8,192 rows fit: rows evicted and moved late in the run */
    srv_table_bounds eviction = {.table_bytes = 400000, .full = PS_TABLE_FULL_EVICT};
    srv_tables ts;
    uint32_t ti;
    srv_tables_init(&ts, 1ull << 30);
    srv_tables_set_bounds(&ts, &eviction);
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    srv_row_hint h = {0};
    static uint64_t k[N], q[N];
    static uint8_t kb[N * 8], qb[N * 8];
    static float rows[N * 4], g[N * 4];
    uint64_t xs = 0x2545f4914f6cdd1dull;
    int repeats = 0, through_bits = 0;
    for (uint32_t j = 0; j < N * 4; j++)
        g[j] = (float)(0.01 * (j % 7) - 0.03);
    for (int round = 0; round < ROUNDS; round++) {
        for (int which = 0; which < 2; which++) {
            uint64_t *out = which ? q : k;
            for (uint32_t m = 0; m < N; m++) {
                xs ^= xs << 13, xs ^= xs >> 7, xs ^= xs << 17;
                out[m] = (xs % SPACE) * 0x100000001b3ull + 7; /* repeats happen: 300 of 3,000 */
            }
        }
        /* half the rounds without a repeat: each key's first use kept, the
         * repeats replaced by the next keys of the space not in the list
         * (every fourth round, by keys past the space: never stored, not
         * found by the pull) */
        if (round % 2 == 0) {
            static uint8_t in[SPACE];
            memset(in, 0, sizeof in);
            for (uint32_t m = 0; m < N; m++) {
                uint64_t r = (k[m] - 7) / 0x100000001b3ull;
                if (!in[r]) {
                    in[r] = 1;
                    continue;
                }
                if (round % 4 == 2) {
                    k[m] = (SPACE + round * (uint64_t)N + m) * 0x100000001b3ull + 7;
                    continue;
                }
                while (in[r])
                    r = (r + 1) % SPACE;
                in[r] = 1;
                k[m] = r * 0x100000001b3ull + 7;
            }
        }
        keys_le(kb, k, N);
        keys_le(qb, q, N);
        srv_tables_pull_hint(&ts, ti, kb, N, rows, &h);
        if (round % 3 == 1) { /* a push of other keys: stores, evicts and moves rows */
            uint32_t a, b;
            if (srv_tables_first_dup(&ts, qb, N, &a, &b) == 0)
                assert_int_equal(srv_tables_push(&ts, ti, qb, N, g, 1.0, err, sizeof err), 0);
        }
        const uint8_t *check = round % 7 == 3 ? qb : kb; /* 3: the hint of other keys */
        uint32_t a1 = 0, b1 = 0, a2 = 0, b2 = 0;
        size_t words_before = ts.dupbits_words;
        int r1 = srv_tables_first_dup_hint(&ts, ti, check, N, &h, &a1, &b1);
        int r2 = srv_tables_first_dup(&ts, check, N, &a2, &b2);
        assert_int_equal(r1, r2);
        if (r1 == 1) {
            assert_int_equal(a1, a2);
            assert_int_equal(b1, b2);
            repeats++;
        }
        for (size_t w = 0; w < ts.dupbits_words; w++)
            assert_true(ts.dupbits[w] == 0);
        through_bits += ts.dupbits_words > words_before;
        if (r1 == 0 && check == kb) /* the pushed keys: stored for the next rounds' pulls */
            assert_int_equal(srv_tables_push_hint(&ts, ti, kb, N, g, 1.0, &h, err, sizeof err), 0);
    }
    assert_true(repeats > ROUNDS / 4);
    assert_true(through_bits > 0); /* the bits were used */
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_true(st.evicted > 0); /* and rows moved under some hints */
    srv_row_hint_free(&h);
    srv_tables_free(&ts);
}

/* A BSP round's table pushes: summed in shard order whatever the arrival
 * order (bit for bit), divided by the pushes, one step per key; a key twice
 * from one shard is DUPLICATE; a dropped shard's pushes and those of
 * shards not taking part leave no trace. */
static void round_run(const int *order, int norder, float *out)
{
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_hp hp = hp1(PS_HP_LR, 0.1);
    ps_table_def d = def("e", 3, "uniform", 0.5, "adagrad", &hp);
    ps_table_def d2 = def("f", 1, "zeros", 0, "sgd", NULL);
    uint32_t ti, t2;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&ts, &d2, &t2, err, sizeof err), 0);
    srv_tround r = {0};
    /* shard s pushes keys {s, 10, 20} with rows 0.1 x (s + 1) x (1, 1/3, 1/7),
     * values whose sums round differently in another order */
    for (int o = 0; o < norder; o++) {
        uint32_t s = (uint32_t)order[o];
        uint64_t k[3] = {s, 10, 20};
        uint8_t kb[24];
        keys_le(kb, k, 3);
        float g[9];
        for (int i = 0; i < 9; i++)
            g[i] = (float)(0.1 * (s + 1) * (i % 3 == 0 ? 1.0 : i % 3 == 1 ? 1.0 / 3 : 1.0 / 7) + 1e-3 * i);
        uint64_t dup = 0;
        assert_int_equal(srv_tround_keep(&r, s, ti, kb, 3, g, 3, &dup), 0);
        /* the same key again from the same shard and table: refused */
        assert_int_equal(srv_tround_keep(&r, s, ti, kb + 8, 1, g, 3, &dup), PS_EDUPLICATE);
        assert_true(dup == 10);
        /* the same key in another table: fine */
        assert_int_equal(srv_tround_keep(&r, s, t2, kb + 8, 1, g, 1, &dup), 0);
    }
    /* shard 3 pushed and left; shard 4 pushed but does not take part */
    uint64_t k9[1] = {10};
    uint8_t kb9[8];
    keys_le(kb9, k9, 1);
    float big[3] = {100, 100, 100};
    uint64_t dup;
    assert_int_equal(srv_tround_keep(&r, 3, ti, kb9, 1, big, 3, &dup), 0);
    assert_int_equal(srv_tround_keep(&r, 4, ti, kb9, 1, big, 3, &dup), 0);
    srv_tround_drop(&r, 3);
    assert_int_equal(srv_tround_keep(&r, 3, ti, kb9, 1, big, 3, &dup), 0); /* after the drop, anew */
    srv_tround_drop(&r, 3);
    static const uint32_t in[3] = {0, 1, 2};
    uint32_t failed = 9;
    assert_int_equal(srv_tround_apply(&r, &ts, in, 3, 1.0 / 3, &failed, err, sizeof err), 0);
    assert_int_equal(failed, 0);
    assert_int_equal(r.np, 0);
    uint64_t pk[5] = {0, 1, 2, 10, 20};
    uint8_t pb[40];
    keys_le(pb, pk, 5);
    srv_tables_pull(&ts, ti, pb, 5, out);
    srv_tables_pull(&ts, t2, pb + 24, 1, out + 15);
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 5);
    srv_tround_free(&r);
    srv_tables_free(&ts);
}

static void test_round_shard_order(void **state)
{
    (void)state;
    static const int orders[6][3] = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {2, 0, 1}, {0, 2, 1}, {1, 2, 0}};
    float first[16], out[16];
    round_run(orders[0], 3, first);
    for (int o = 1; o < 6; o++) {
        round_run(orders[o], 3, out);
        assert_memory_equal(out, first, sizeof first);
    }
    /* the reference: key 10's sum in shard order, over 3, one adagrad step */
    ps_hp hp = hp1(PS_HP_LR, 0.1);
    ps_table_def d = def("e", 3, "uniform", 0.5, "adagrad", &hp);
    float row[6], sum[3] = {0, 0, 0};
    srv_sparse_row_new(&d, 10, row);
    for (uint32_t s = 0; s < 3; s++)
        for (int i = 0; i < 3; i++)
            sum[i] += (float)(0.1 * (s + 1) * (i == 0 ? 1.0 : i == 1 ? 1.0 / 3 : 1.0 / 7) + 1e-3 * (3 + i));
    assert_true(srv_sparse_step(&d, row, sum, 1.0 / 3));
    assert_memory_equal(out + 9, row, 3 * sizeof(float));
    /* key 1: shard 1's row alone, still over 3 */
    srv_sparse_row_new(&d, 1, row);
    float g1[3];
    for (int i = 0; i < 3; i++)
        g1[i] = (float)(0.1 * 2 * (i == 0 ? 1.0 : i == 1 ? 1.0 / 3 : 1.0 / 7) + 1e-3 * i);
    assert_true(srv_sparse_step(&d, row, g1, 1.0 / 3));
    assert_memory_equal(out + 3, row, 3 * sizeof(float));
    /* table f, key 10: sgd of the three rows' first values over 3 */
    float f = 0;
    for (uint32_t s = 0; s < 3; s++)
        f += (float)(0.1 * (s + 1));
    assert_true(out[15] == (float)(0.0 - 0.01 * ((1.0 / 3) * f)));
}

/* A round whose float32 sum of a key's rows overflows though their mean
 * does not (two shards pushing -3.4e38, three pushing 2e38): the table's
 * sums are made in double in shard order and scaled before rounding, so
 * the mean applies, the same bits whatever the arrival order; another
 * table of the same round keeps its float32 sums. */
static void wide_round(const int *order, float *out)
{
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_hp hp = hp1(PS_HP_LR, 1.0);
    ps_table_def d = def("e", 2, "zeros", 0, "sgd", &hp), d2 = def("f", 1, "zeros", 0, "sgd", &hp);
    uint32_t ti, t2;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&ts, &d2, &t2, err, sizeof err), 0);
    srv_tround r = {0};
    for (int o = 0; o < 3; o++) {
        uint32_t s = (uint32_t)order[o];
        uint64_t k[2] = {7, 8};
        uint8_t kb[16];
        keys_le(kb, k, 2);
        /* key 7: -3.4e38 from shards 0 and 1, 1e38 from 2; key 8: 2e38 from each */
        float g[4] = {s < 2 ? -3.4e38f : 1e38f, 0.1f * (float)(s + 1), 2e38f, 1.0f / 3};
        float g2[1] = {0.1f * (float)(s + 1)};
        uint64_t dup;
        assert_int_equal(srv_tround_keep(&r, s, ti, kb, 2, g, 2, &dup), 0);
        assert_int_equal(srv_tround_keep(&r, s, t2, kb, 1, g2, 1, &dup), 0);
    }
    static const uint32_t in[3] = {0, 1, 2};
    uint32_t failed = 9;
    assert_int_equal(srv_tround_apply(&r, &ts, in, 3, 1.0 / 3, &failed, err, sizeof err), 0);
    assert_int_equal(failed, 0);
    uint8_t kb[16];
    keys_le(kb, (const uint64_t[]){7, 8}, 2);
    srv_tables_pull(&ts, ti, kb, 2, out);
    srv_tables_pull(&ts, t2, kb, 1, out + 4);
    srv_tround_free(&r);
    srv_tables_free(&ts);
}

static void test_round_sum_past_float32(void **state)
{
    (void)state;
    static const int orders[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}};
    float first[5], out[5];
    wide_round(orders[0], first);
    for (int o = 1; o < 3; o++) {
        wide_round(orders[o], out);
        assert_memory_equal(out, first, sizeof first);
    }
    /* sgd, lr 1, from zeros: minus the mean, made in double and rounded once */
    double s7 = (double)-3.4e38f + (double)-3.4e38f + (double)1e38f;
    assert_true(first[0] == (float)(0.0 - 1.0 * (double)(float)(s7 * (1.0 / 3))));
    assert_true(isfinite(first[0]) && first[0] > 1.5e38f);
    double s = 0;
    for (int k = 0; k < 3; k++)
        s += (double)(0.1f * (float)(k + 1));
    assert_true(first[1] == (float)(0.0 - (double)(float)(s * (1.0 / 3))));
    assert_true(first[2] == (float)(-(double)(float)(((double)2e38f * 3) * (1.0 / 3))));
    assert_true(first[3] == (float)(-(double)(float)(((double)(1.0f / 3) * 3) * (1.0 / 3))));
    /* table f summed in float32 as ever (its sums are finite) */
    float f = 0;
    for (int k = 0; k < 3; k++)
        f += 0.1f * (float)(k + 1);
    assert_true(first[4] == (float)(0.0 - 1.0 * ((1.0 / 3) * f)));
}

/* The rows' clocks are held only while expiry or eviction reads them: a
 * table with neither takes no stamp; turning expiry on (a reload) gives
 * every row the table's clock at that moment, so rows go `expire` pushes
 * after it and not before; turning it off frees the clocks again; the
 * checkpoint's stamps of a table without clocks are the table's clock. */
static void count_stamp(uint64_t stamp, void *arg)
{
    uint64_t *a = arg;
    a[0]++;
    if (stamp != a[1])
        a[2]++;
}

static void test_stamps_only_when_read(void **state)
{
    (void)state;
    srv_tables ts, tx;
    srv_tables_init(&ts, 1ull << 30);
    srv_tables_init(&tx, 1ull << 30);
    srv_table_bounds none = {0}, expire = {.expire = 5};
    srv_tables_set_bounds(&tx, &expire);
    ps_table_def d = def("e", 4, "zeros", 0, "sgd", NULL);
    uint32_t ti, tj;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&tx, &d, &tj, err, sizeof err), 0);
    for (uint64_t k = 1; k <= 10; k++) {
        assert_int_equal(push1(&ts, ti, k, 1.0f), 0); /* clocks 1..10 */
        assert_int_equal(push1(&tx, tj, k, 1.0f), 0);
    }
    /* the same rows: the table with expiry takes 8 bytes a row more (a
     * block's stamps at least), the other none */
    assert_true(tx.bytes >= ts.bytes + 8 * 10);
    uint64_t plain = ts.bytes, with = tx.bytes;
    uint64_t cnt[3] = {0, 10, 0};
    srv_tables_each_stamp(&ts, ti, count_stamp, cnt); /* no clocks: each row at the table's clock */
    assert_int_equal(cnt[0], 10);
    assert_int_equal(cnt[2], 0);
    /* a reload turns expiry on: the clocks start at 10 */
    srv_tables_set_bounds(&ts, &expire);
    assert_int_equal(push1(&ts, ti, 100, 1.0f), 0); /* clock 11 */
    assert_int_equal(ts.bytes, with + (tx.bytes - with)); /* the same memory as the table bounded from the start */
    assert_int_equal(ts.bytes, tx.bytes);
    uint64_t cnt2[3] = {0, 10, 0};
    srv_tables_each_stamp(&ts, ti, count_stamp, cnt2);
    assert_int_equal(cnt2[0], 11);
    assert_int_equal(cnt2[2], 1); /* key 100's, 11 */
    for (int p = 12; p <= 15; p++)
        assert_int_equal(push1(&ts, ti, 100, 1.0f), 0);
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.clock, 15);
    assert_int_equal(st.rows, 11); /* untouched for 5 pushes: kept */
    assert_int_equal(push1(&ts, ti, 100, 1.0f), 0); /* 16: untouched for 6 */
    srv_tables_stats(&ts, ti, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.expired, 10);
    assert_non_null(srv_tables_row(&ts, ti, 100));
    /* expiry off again: the clocks are freed */
    srv_tables_set_bounds(&ts, &none);
    assert_int_equal(push1(&ts, ti, 100, 1.0f), 0);
    assert_int_equal(ts.bytes, plain);
    srv_tables_free(&ts);
    srv_tables_free(&tx);
}

/* Turning eviction on for a table at its cap: the clocks need room, made
 * by evicting rows (table_full = evict), memory never past the cap; with
 * refuse and expiry the push is LIMIT, naming the clocks. */
static void test_stamps_at_cap(void **state)
{
    (void)state;
    ps_table_def d = def("e", 4, "zeros", 0, "sgd", NULL);
    for (int ev = 0; ev < 2; ev++) {
        srv_tables ts;
        srv_tables_init(&ts, 1ull << 30);
        uint32_t ti;
        assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
        static uint64_t k[40000];
        static uint8_t kb[40000 * 8];
        static float g[40000 * 4];
        for (uint64_t i = 0; i < 40000; i++)
            k[i] = i * 7919 + 3;
        keys_le(kb, k, 40000);
        assert_int_equal(srv_tables_push(&ts, ti, kb, 40000, g, 1.0, err, sizeof err), 0);
        srv_tables_set_limit(&ts, ts.bytes); /* full: no room for 8 more bytes a row (blocks of 8192 rows) */
        srv_table_bounds b = {.expire = 1000, .full = ev ? PS_TABLE_FULL_EVICT : PS_TABLE_FULL_REFUSE};
        srv_tables_set_bounds(&ts, &b);
        srv_table_stats st;
        uint64_t k1 = 1; /* not among the rows (they are 3 mod 7919) */
        uint8_t kb1[8];
        keys_le(kb1, &k1, 1);
        if (ev) {
            assert_int_equal(srv_tables_push(&ts, ti, kb1, 1, g, 1.0, err, sizeof err), 0);
            srv_tables_stats(&ts, ti, &st);
            assert_true(st.evicted >= 8192); /* a block's worth at least: blocks are freed whole */
            assert_int_equal(st.rows, 40001 - st.evicted);
            assert_non_null(srv_tables_row(&ts, ti, 1));
            assert_true(ts.bytes <= ts.max_bytes);
            check_rows(&ts);
        } else {
            assert_int_equal(srv_tables_push(&ts, ti, kb1, 1, g, 1.0, err, sizeof err), PS_ELIMIT);
            assert_has(err, "table 'e': its 40000 rows and their clocks");
            assert_has(err, "(table_full = refuse)");
            srv_tables_stats(&ts, ti, &st);
            assert_int_equal(st.rows, 40000);
            assert_true(ts.bytes <= ts.max_bytes);
        }
        srv_tables_free(&ts);
    }
}

/* Two keys whose hashes agree on their home slot and their tag at 1024
 * slots (the tag is the hash's bits 42..63 there, the home its bits 0..9:
 * found by a birthday search over 2^18 keys): each finds its own row, a
 * pull of the one not stored answers its initial row, not the other's,
 * in the pipelined path too, and removing one leaves the other found. */
typedef struct sig {
    uint64_t sig, key;
} sig;

static int by_sig(const void *a, const void *b)
{
    const sig *x = a, *y = b;
    return x->sig < y->sig ? -1 : x->sig > y->sig;
}

static void test_tag_collision(void **state)
{
    (void)state;
    enum { N = 1 << 18 };
    sig *s = malloc(sizeof *s * N);
    assert_non_null(s);
    for (uint64_t i = 0; i < N; i++) {
        uint64_t key = (i + 1) * 0x9e3779b97f4a7c15ull, h = ps_mix64(key);
        s[i] = (sig){(h & 1023) | ((h >> 42) << 10), key};
    }
    qsort(s, N, sizeof *s, by_sig);
    uint64_t a = 0, b = 0;
    for (uint64_t i = 1; i < N && !a; i++)
        if (s[i].sig == s[i - 1].sig) {
            a = s[i - 1].key;
            b = s[i].key;
        }
    free(s);
    assert_true(a != b);
    assert_true((ps_mix64(a) & 1023) == (ps_mix64(b) & 1023));
    assert_true((ps_mix64(a) >> 42) == (ps_mix64(b) >> 42));

    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_table_def d = def("e", 4, "uniform", 0.5, "sgd", NULL);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    /* 40 keys, a at 20 and b at 30: past the finder's first ROW_AHEAD */
    uint64_t k[40];
    for (int i = 0; i < 40; i++)
        k[i] = 1000 + (uint64_t)i;
    k[20] = a;
    k[30] = b;
    uint8_t kb[40 * 8];
    keys_le(kb, k, 40);
    float ga[4] = {1, 1, 1, 1}, out[40 * 4], init_b[4];
    ps_table_row_init(&d, b, init_b);
    assert_int_equal(srv_tables_push(&ts, ti, kb + 20 * 8, 1, ga, 1.0, err, sizeof err), 0); /* a alone */
    assert_non_null(srv_tables_row(&ts, ti, a));
    assert_null(srv_tables_row(&ts, ti, b));
    srv_tables_pull(&ts, ti, kb, 40, out);
    assert_memory_equal(out + 30 * 4, init_b, sizeof init_b);
    assert_memory_equal(out + 20 * 4, srv_tables_row(&ts, ti, a), 4 * sizeof(float));
    /* every key stored, b's row its own */
    static float g[40 * 4];
    for (int i = 0; i < 40 * 4; i++)
        g[i] = (float)i;
    assert_int_equal(srv_tables_push(&ts, ti, kb, 40, g, 1.0, err, sizeof err), 0);
    const float *ra = srv_tables_row(&ts, ti, a), *rb = srv_tables_row(&ts, ti, b);
    assert_non_null(ra);
    assert_non_null(rb);
    assert_ptr_not_equal(ra, rb);
    float want_b[4];
    srv_sparse_row_new(&d, b, want_b);
    assert_true(srv_sparse_step(&d, want_b, g + 30 * 4, 1.0));
    assert_memory_equal(rb, want_b, sizeof want_b); /* b's own row, stepped with its own gradient */
    srv_tables_pull(&ts, ti, kb, 40, out);
    assert_memory_equal(out + 20 * 4, ra, 4 * sizeof(float));
    assert_memory_equal(out + 30 * 4, rb, 4 * sizeof(float));
    assert_int_equal(check_rows(&ts), 40);
    /* a goes (expiry: every key but a pushed twice more), b stays found */
    srv_table_bounds bd = {.expire = 1};
    srv_tables_set_bounds(&ts, &bd);
    uint64_t rest[39];
    for (int i = 0, j = 0; i < 40; i++)
        if (k[i] != a)
            rest[j++] = k[i];
    uint8_t rb8[39 * 8];
    keys_le(rb8, rest, 39);
    for (int p = 0; p < 3; p++)
        assert_int_equal(srv_tables_push(&ts, ti, rb8, 39, g, 1.0, err, sizeof err), 0);
    assert_null(srv_tables_row(&ts, ti, a));
    assert_non_null(srv_tables_row(&ts, ti, b));
    assert_int_equal(check_rows(&ts), 39);
    srv_tables_free(&ts);
}

/* ---- a snapshot read block by block while pushes go on (table_snap.c) ---- */

/* Every row of table i as srv_tables_each and srv_tables_each_stamp give
 * them: keys, rows and clocks in three arrays (the caller frees them). */
typedef struct whole {
    uint64_t n;
    uint64_t *keys, *stamps;
    float *rows;
    uint32_t rf;
} whole;

static void whole_row(uint64_t key, const float *row, void *arg)
{
    whole *w = arg;
    w->keys[w->n] = key;
    memcpy(w->rows + w->n * w->rf, row, sizeof(float) * w->rf);
    w->n++;
}

static void whole_stamp(uint64_t stamp, void *arg)
{
    whole *w = arg;
    w->stamps[w->n++] = stamp;
}

static whole whole_of(srv_tables *ts, uint32_t i)
{
    srv_table_stats st;
    srv_tables_stats(ts, i, &st);
    whole w = {.rf = srv_sparse_row_floats(srv_tables_def(ts, i))};
    w.keys = malloc(8 * (st.rows + 1));
    w.stamps = malloc(8 * (st.rows + 1));
    w.rows = malloc(sizeof(float) * w.rf * (st.rows + 1));
    assert_true(w.keys && w.stamps && w.rows);
    srv_tables_each(ts, i, whole_row, &w);
    w.n = 0;
    srv_tables_each_stamp(ts, i, whole_stamp, &w);
    assert_int_equal(w.n, st.rows);
    return w;
}

static void whole_free(whole *w)
{
    free(w->keys);
    free(w->stamps);
    free(w->rows);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}

/* Reads snapshot id to its end, calling between(ts, call) before each
 * block, and compares every block with want[table]: the rows as they were
 * when it was taken, bit for bit. Returns the blocks read. */
static int snap_read_all(srv_tables *ts, uint64_t id, const whole *want, uint32_t ntables,
                         void (*between)(srv_tables *ts, int call))
{
    uint64_t seen[4] = {0};
    srv_tables_block b;
    int blocks = 0, rc;
    for (;;) {
        if (between)
            between(ts, blocks);
        if ((rc = srv_tables_snap_next(ts, id, &b)) != 1)
            break;
        assert_true(b.table < ntables);
        const whole *w = &want[b.table];
        assert_int_equal(b.first, seen[b.table]); /* in order, none left out */
        assert_true(b.first + b.n <= w->n);
        for (uint32_t k = 0; k < b.n; k++) {
            uint64_t r = b.first + k;
            assert_int_equal(le64(b.keys + 8 * k), w->keys[r]);
            assert_int_equal(le64(b.stamps + 8 * k), w->stamps[r]);
            assert_memory_equal(b.rows + (size_t)k * w->rf, w->rows + r * w->rf, sizeof(float) * w->rf);
        }
        seen[b.table] += b.n;
        blocks++;
    }
    assert_int_equal(rc, 0);
    for (uint32_t i = 0; i < ntables; i++)
        assert_int_equal(seen[i], want[i].n);
    return blocks;
}

static uint64_t snap_next_key = 1000000;
static int snap_pass;

/* What goes on between two blocks: pushes to old rows anywhere in the
 * table (those of blocks not read yet first), new rows, and with the
 * bounds on, rows expired and evicted (each moving the last row into its
 * place) and blocks freed. */
static void snap_churn(srv_tables *ts, int call)
{
    static uint64_t k[300];
    static uint8_t kb[300 * 8];
    static float g[300 * 8]; /* the widest table's rows: dim 8 */
    for (int i = 0; i < 300 * 8; i++)
        g[i] = 0.5f + (float)(i % 7);
    int n = 0;
    for (int i = 0; i < 200; i++) /* old keys: 0..19999, spread */
        k[n++] = (uint64_t)((i * 7919 + call * 104729) % 20000);
    for (int i = 0; i < 100; i++)
        k[n++] = snap_next_key++;
    keys_le(kb, k, (size_t)n);
    if (snap_pass == 3 && call == 1) { /* no bound reads the clocks: they go */
        srv_table_bounds none = {0};
        srv_tables_set_bounds(ts, &none);
    } else if (snap_pass == 4 && call == 2) {
        /* they come back, and do not fit beside every row: rows evicted
         * at random and the blocks past the rest freed */
        srv_table_bounds tight = {.expire = 1000000, .table_bytes = 400000, .full = PS_TABLE_FULL_EVICT};
        srv_tables_set_bounds(ts, &tight);
    }
    uint32_t a, b;
    if (srv_tables_first_dup(ts, kb, (uint32_t)n, &a, &b) == 1)
        n = (int)a; /* distinct keys: the first n */
    assert_int_equal(srv_tables_push(ts, 0, kb, (uint32_t)n, g, 1.0, err, sizeof err), 0);
    assert_int_equal(srv_tables_push(ts, 1, kb, (uint32_t)n, g, 0.25, err, sizeof err), 0);
}

/* Two tables of 20,000 rows each (several blocks), a snapshot taken, then
 * between every two blocks read: pushes to rows not read yet and new rows;
 * in the third pass also expiry and eviction moving rows; in the fourth
 * the rows' clocks freed; in the fifth, clocks made with rows evicted and
 * blocks freed. Every block read equals the tables as they were when it was
 * taken. */
static void test_snapshot_under_pushes(void **state)
{
    (void)state;
    for (int pass = 0; pass < 5; pass++) {
        snap_pass = pass;
        srv_tables ts;
        srv_tables_init(&ts, 1ull << 30);
        srv_table_bounds bd = {0};
        if (pass >= 1 && pass <= 3)
            bd.expire = 40000; /* the rows carry clocks */
        srv_tables_set_bounds(&ts, &bd);
        ps_hp h = hp1(PS_HP_LR, 0.1);
        ps_table_def d0 = def("a", 4, "normal", 0.1, "adagrad", &h), d1 = def("b", 8, "zeros", 0, "adam", NULL);
        uint32_t t0, t1;
        assert_int_equal(srv_tables_declare(&ts, &d0, &t0, err, sizeof err), 0);
        assert_int_equal(srv_tables_declare(&ts, &d1, &t1, err, sizeof err), 0);
        static uint64_t k[20000];
        static uint8_t kb[20000 * 8];
        static float g[20000 * 8];
        for (int i = 0; i < 20000; i++)
            k[i] = (uint64_t)i;
        for (int i = 0; i < 20000 * 8; i++)
            g[i] = (float)(i % 13) - 6.0f;
        keys_le(kb, k, 20000);
        for (int p = 0; p < 3; p++) {
            assert_int_equal(srv_tables_push(&ts, t0, kb, 20000 - 1000 * (uint32_t)p, g, 1.0, err, sizeof err), 0);
            assert_int_equal(srv_tables_push(&ts, t1, kb, 20000, g, 1.0, err, sizeof err), 0);
        }
        whole want[2] = {whole_of(&ts, 0), whole_of(&ts, 1)};
        uint64_t id;
        assert_int_equal(srv_tables_snap_begin(&ts, &id), 0);
        uint64_t other;
        assert_int_equal(srv_tables_snap_begin(&ts, &other), PS_ESTATE); /* one at a time */
        if (pass == 2) {
            /* the bounds tighten: a table cap evicts rows and frees blocks,
             * expiry removes rows pushed long ago, clocks come and go */
            bd.expire = 2;
            bd.table_bytes = 600000;
            bd.full = PS_TABLE_FULL_EVICT;
            srv_tables_set_bounds(&ts, &bd);
        }
        int blocks = snap_read_all(&ts, id, want, 2, snap_churn);
        assert_true(blocks >= 6); /* 20,000 rows are several blocks in each table */
        srv_tables_snap_end(&ts, id);
        if (pass == 2 || pass == 4) {
            srv_table_stats st;
            srv_tables_stats(&ts, 0, &st);
            assert_true(st.evicted + st.expired > 10000); /* the churn removed rows while it was read */
            assert_true(st.rows < 10000); /* and freed blocks */
            bd.expire = 0;
            bd.full = PS_TABLE_FULL_REFUSE;
            bd.table_bytes = 0;
            srv_tables_set_bounds(&ts, &bd);
        }
        /* a new one reads the tables as they are now */
        whole now[2] = {whole_of(&ts, 0), whole_of(&ts, 1)};
        assert_int_equal(srv_tables_snap_begin(&ts, &id), 0);
        snap_read_all(&ts, id, now, 2, NULL);
        srv_tables_snap_end(&ts, id);
        for (int i = 0; i < 2; i++) {
            whole_free(&want[i]);
            whole_free(&now[i]);
        }
        /* freed or moved while read: the snapshot is gone, said so */
        assert_int_equal(srv_tables_snap_begin(&ts, &id), 0);
        srv_tables_block b;
        assert_int_equal(srv_tables_snap_next(&ts, id, &b), 1);
        srv_tables out;
        srv_tables_move(&ts, &out);
        assert_int_equal(srv_tables_snap_next(&ts, id, &b), PS_ESTATE);
        srv_tables_move_back(&ts, &out, 0); /* back as they were: it goes on */
        assert_int_equal(srv_tables_snap_next(&ts, id, &b), 1);
        srv_tables_free(&ts);
        assert_int_equal(srv_tables_snap_next(&ts, id, &b), PS_ESTATE);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_against_pytorch),
        cmocka_unit_test(test_adagrad_against_pytorch),
        cmocka_unit_test(test_adam_against_pytorch),
        cmocka_unit_test(test_ftrl_against_reference),
        cmocka_unit_test(test_step_overflow),
        cmocka_unit_test(test_store_against_reference),
        cmocka_unit_test(test_rows_created_on_push_only),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_admission_ages),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_stamps_survive_reload),
        cmocka_unit_test(test_stamps_only_when_read),
        cmocka_unit_test(test_stamps_at_cap),
        cmocka_unit_test(test_tag_collision),
        cmocka_unit_test(test_snapshot_under_pushes),
        cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_nonfinite_update_changes_nothing),
        cmocka_unit_test(test_push_failure_restores_rows),
        cmocka_unit_test(test_step_kernels_exact),
        cmocka_unit_test(test_push_failure_names_first_key),
        cmocka_unit_test(test_step_nonfinite_leaves_row),
        cmocka_unit_test(test_declare),
        cmocka_unit_test(test_first_dup),
        cmocka_unit_test(test_first_dup_hint),
        cmocka_unit_test(test_row_hints_are_only_guesses),
        cmocka_unit_test(test_round_shard_order),
        cmocka_unit_test(test_round_sum_past_float32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
