/* test_model.c - psd's parameter store (server/model.c): parameters in
 * copy-on-write blocks. An update of a block that a reply or a snapshot
 * holds goes to a fresh block and leaves the held values as they were; the
 * update computed out of place equals the one in place bit for bit, for
 * every optimizer; ranges across block edges; freed blocks are reused; an
 * update's fresh blocks are reserved all or none, so running out of memory
 * leaves the model as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "server/config/config.h"
#include "proto/errors.h"
#include "server/store/psd.h"

/* aligned_alloc as model.c sees it (the test links with
 * -Wl,--wrap=aligned_alloc): fails once allocs_left reaches 0; -1 never. */
static int allocs_left = -1;
void *__real_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size)
{
    if (allocs_left == 0)
        return NULL;
    if (allocs_left > 0)
        allocs_left--;
    return __real_aligned_alloc(align, size);
}

/* two whole blocks and a short third */
#define NB ((size_t)SRV_BLK_FLOATS)
#define N (2 * NB + 1000)

static ps_config cfg_for(int kind)
{
    ps_config c;
    ps_config_defaults(&c);
    c.optimizer = kind;
    c.lr = 0.01;
    c.momentum = kind == PS_OPTIMIZER_SGD ? 0.9 : 0;
    c.weight_decay = 1e-4;
    c.clip_norm = 0;
    return c;
}

static void setup_model(srv_model *m, const ps_config *cfg)
{
    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {(uint32_t)N};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    memset(m, 0, sizeof *m);
    assert_int_equal(srv_model_set_layout(m, &l, cfg), 0);
    assert_int_equal(m->nblk, 3);
    for (uint64_t off = 0; off < N;) {
        srv_wseg seg;
        assert_int_equal(srv_model_write_begin(m, off, N - off, &seg), 0);
        for (size_t i = 0; i < seg.len; i++)
            seg.wo[i] = (float)((off + i) % 1000) * 1e-3f - 0.5f;
        srv_model_write_end(m, &seg);
        off += seg.len;
    }
}

static void read_all(const srv_model *m, float *out)
{
    for (uint64_t off = 0; off < N;) {
        size_t len;
        const float *p = srv_model_at(m, off, N - off, &len);
        assert_true(len >= 1 && len <= N - off);
        memcpy(out + off, p, len * sizeof(float));
        off += len;
    }
}

/* An update of [off, off+n) piece by piece, as psd's policies make one:
 * srv_model_write_begin() per block, the optimizer from wi to wo, then
 * srv_model_write_end(). */
static int apply(srv_model *m, const srv_optim_step *st, const float *g, uint64_t off, uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        srv_wseg seg;
        int rc = srv_model_write_begin(m, off + done, n - done, &seg);
        if (rc != 0)
            return rc;
        srv_optim_run(&m->opt, st, seg.wo, seg.wi, g + done, off + done, seg.len);
        srv_model_write_end(m, &seg);
        done += seg.len;
    }
    return 0;
}

static void grad(float *g, size_t n, int t)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (float)((int)((i * 7 + (size_t)t * 3) % 11) - 5) * 0.1f;
}

/* Pieces of a range: each within one block, together the range. */
static void test_at_splits_at_block_edges(void **state)
{
    (void)state;
    ps_config cfg = cfg_for(PS_OPTIMIZER_SGD);
    srv_model m;
    setup_model(&m, &cfg);
    size_t len;
    const float *p = srv_model_at(&m, NB - 10, 100, &len);
    assert_int_equal(len, 10);
    assert_ptr_equal(p, m.blk[0]->w + NB - 10);
    p = srv_model_at(&m, NB, 100, &len);
    assert_int_equal(len, 100);
    assert_ptr_equal(p, m.blk[1]->w);
    p = srv_model_at(&m, 2 * NB + 900, 5000, &len);
    assert_int_equal(len, 100); /* the last block is short */
    srv_model_free(&m);
}

/* The same updates to two models, one of them shared by a snapshot before
 * every step (so it is updated out of place), give the same bits; the
 * snapshot keeps the values of its version; untouched blocks stay shared. */
static void run_kind(int kind)
{
    ps_config cfg = cfg_for(kind);
    srv_model a, b;
    setup_model(&a, &cfg);
    setup_model(&b, &cfg);
    float *g = malloc(N * sizeof(float)), *va = malloc(N * sizeof(float)), *vb = malloc(N * sizeof(float)),
          *before = malloc(N * sizeof(float));
    assert_non_null(g);
    assert_non_null(va);
    assert_non_null(vb);
    assert_non_null(before);
    /* a range from inside block 0 across block 1 into block 2 */
    const uint64_t off = NB - 300, n = NB + 600;
    for (int t = 0; t < 3; t++) {
        grad(g, n, t);
        read_all(&b, before);
        srv_snap *snap = srv_snap_take(&b);
        assert_non_null(snap);
        assert_int_equal(snap->version, b.version);
        srv_blk *held[3] = {b.blk[0], b.blk[1], b.blk[2]};
        srv_optim_step st;
        srv_optim_begin(&a.opt, &st, g, n, a.version);
        assert_int_equal(apply(&a, &st, g, off, n), 0);
        srv_optim_begin(&b.opt, &st, g, n, b.version);
        assert_int_equal(apply(&b, &st, g, off, n), 0);
        srv_model_bump(&a);
        srv_model_bump(&b);
        read_all(&a, va);
        read_all(&b, vb);
        assert_memory_equal(va, vb, N * sizeof(float));
        /* blocks 0..2 were all touched: each replaced, the snapshot's intact */
        for (int i = 0; i < 3; i++) {
            assert_ptr_not_equal(b.blk[i], held[i]);
            assert_ptr_equal(snap->blk[i], held[i]);
            assert_int_equal(held[i]->refs, 1);
            assert_int_equal(b.blk[i]->refs, 1);
        }
        for (uint64_t o = 0; o < N;) {
            size_t len;
            const float *p = srv_snap_at(snap, o, N - o, &len);
            assert_memory_equal(p, before + o, len * sizeof(float));
            o += len;
        }
        /* values outside the range came over to the fresh blocks */
        assert_memory_equal(vb, before, off * sizeof(float));
        assert_memory_equal(vb + off + n, before + off + n, (N - off - n) * sizeof(float));
        srv_snap_unref(snap);
    }
    free(g);
    free(va);
    free(vb);
    free(before);
    srv_model_free(&a);
    srv_model_free(&b);
}

static void test_out_of_place_equals_in_place(void **state)
{
    (void)state;
    run_kind(PS_OPTIMIZER_SGD);
    run_kind(PS_OPTIMIZER_ADAM);
    run_kind(PS_OPTIMIZER_ADAMW);
    run_kind(PS_OPTIMIZER_ADAGRAD);
}

/* An update of one block copies only that block; a block freed by the
 * last reply holding it is the one the next copy gets (no allocation in
 * steady state). */
static void test_only_touched_blocks_copied_and_reused(void **state)
{
    (void)state;
    ps_config cfg = cfg_for(PS_OPTIMIZER_SGD);
    srv_model m;
    setup_model(&m, &cfg);
    float g[64];
    grad(g, 64, 0);
    srv_optim_step st;
    srv_optim_begin(&m.opt, &st, g, 64, 0);

    srv_blk *orig = m.blk[1];
    srv_blk *reply = srv_blk_ref(orig); /* as a reply in flight holds it */
    srv_blk *other0 = m.blk[0], *other2 = m.blk[2];
    assert_int_equal(apply(&m, &st, g, NB + 5, 64), 0);
    assert_ptr_equal(m.blk[0], other0);
    assert_ptr_equal(m.blk[2], other2);
    assert_ptr_not_equal(m.blk[1], reply);
    srv_blk *fresh = m.blk[1];
    srv_blk_unref(reply); /* the write is done: the old block goes to the pool */

    /* the next copy is the block the first reply freed, from the pool */
    reply = srv_blk_ref(m.blk[1]);
    assert_int_equal(apply(&m, &st, g, NB + 5, 64), 0);
    assert_ptr_equal(m.blk[1], orig);
    srv_blk_unref(reply);
    /* and the one after, the block that reply held */
    reply = srv_blk_ref(m.blk[1]);
    assert_int_equal(apply(&m, &st, g, NB + 5, 64), 0);
    assert_ptr_equal(m.blk[1], fresh);
    srv_blk_unref(reply);
    /* unshared: in place, the same block */
    srv_blk *cur = m.blk[1];
    assert_int_equal(apply(&m, &st, g, NB + 5, 64), 0);
    assert_ptr_equal(m.blk[1], cur);
    srv_model_free(&m);
}

/* An update's blocks are reserved all or none: when the second fresh
 * block cannot be had, the first goes back to the pool and the model, its
 * blocks and their references are as they were. Once reserved, install
 * puts the fresh blocks in and leaves a reply's block to the reply. */
static void test_reserve_all_or_nothing(void **state)
{
    (void)state;
    ps_config cfg = cfg_for(PS_OPTIMIZER_SGD);
    srv_model m;
    setup_model(&m, &cfg);
    srv_blk_pool_free(); /* every fresh block has to be allocated */
    srv_snap *snap = srv_snap_take(&m);
    assert_non_null(snap);
    srv_blk *old[3], *fresh[3];
    uint64_t stamp = m.stamp;

    allocs_left = 1;
    assert_int_equal(srv_model_reserve(&m, 0, 3, old, fresh), PS_ENOMEM);
    allocs_left = -1;
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(m.blk[i], snap->blk[i]);
        assert_int_equal(m.blk[i]->refs, 2);
    }
    assert_int_equal(m.stamp, stamp);
    /* the block allocated before the failure is in the pool, not lost */
    allocs_left = 0;
    assert_int_equal(srv_model_reserve(&m, 0, 1, old, fresh), 0);
    allocs_left = -1;
    assert_ptr_equal(old[0], snap->blk[0]);
    assert_non_null(fresh[0]);
    srv_blk_unref(fresh[0]);

    srv_snap_unref(snap);

    /* blocks 1 and 2, of which a reply in flight holds only block 1: block
     * 2 is written in place */
    srv_blk *reply = srv_blk_ref(m.blk[1]), *held2 = m.blk[2];
    assert_int_equal(srv_model_reserve(&m, 1, 2, old, fresh), 0);
    assert_ptr_equal(old[0], reply);
    assert_non_null(fresh[0]);
    assert_ptr_equal(old[1], held2);
    assert_null(fresh[1]);
    memcpy(fresh[0]->w, old[0]->w, old[0]->cap * sizeof(float));
    fresh[0]->w[5] = 42.0f;
    float was = old[0]->w[5];
    srv_model_install(&m, 1, 2, old, fresh);
    assert_int_equal(m.stamp, stamp + 1);
    assert_ptr_equal(m.blk[1], fresh[0]);
    assert_ptr_equal(m.blk[2], held2);
    assert_int_equal(reply->refs, 1); /* the reply's alone now, its values unchanged */
    assert_true(reply->w[5] == was);
    size_t len;
    assert_true(*srv_model_at(&m, NB + 5, 1, &len) == 42.0f);
    srv_blk_unref(reply);
    srv_model_free(&m);
    srv_blk_pool_free();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_at_splits_at_block_edges),
        cmocka_unit_test(test_out_of_place_equals_in_place),
        cmocka_unit_test(test_only_touched_blocks_copied_and_reused),
        cmocka_unit_test(test_reserve_all_or_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
