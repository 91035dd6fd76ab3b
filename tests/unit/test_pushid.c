/* test_pushid.c - unit tests for server/replog/pushid.c: the highest push
 * id applied per client, its bound, its walk and its restore. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/replog/pushid.h"

static psd *new_psd(void)
{
    psd *s = calloc(1, sizeof *s);
    assert_non_null(s);
    return s;
}

static void del_psd(psd *s)
{
    srv_pushid_free(s);
    free(s);
}

/* A client not seen, and cid or pid 0, are never done. */
static void test_unknown_not_done(void **state)
{
    (void)state;
    psd *s = new_psd();
    assert_int_equal(srv_pushid_done(s, 42, 1), 0);
    srv_pushid_mark(s, 0, 5); /* an old client: nothing recorded */
    srv_pushid_mark(s, 7, 0);
    assert_int_equal(srv_pushid_count(s), 0);
    assert_int_equal(srv_pushid_done(s, 0, 5), 0);
    assert_int_equal(srv_pushid_done(s, 7, 0), 0);
    del_psd(s);
}

/* After marking pid p, every pid <= p is done and every pid above is not;
 * a lower mark does not move the record back. */
static void test_mark_then_done(void **state)
{
    (void)state;
    psd *s = new_psd();
    srv_pushid_mark(s, 0xabcdef, 10);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 1), 1);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 10), 1);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 11), 0);
    srv_pushid_mark(s, 0xabcdef, 3);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 10), 1);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 11), 0);
    srv_pushid_mark(s, 0xabcdef, 11);
    assert_int_equal(srv_pushid_done(s, 0xabcdef, 11), 1);
    /* another client is apart */
    assert_int_equal(srv_pushid_done(s, 0xabcdee, 1), 0);
    assert_int_equal(srv_pushid_count(s), 1);
    del_psd(s);
}

/* Many clients (the table grows, probes collide): each keeps its own. */
static void test_many_clients(void **state)
{
    (void)state;
    psd *s = new_psd();
    for (uint64_t k = 1; k <= 5000; k++)
        srv_pushid_mark(s, k * 0x10000, k); /* clustered keys */
    assert_int_equal(srv_pushid_count(s), 5000);
    for (uint64_t k = 1; k <= 5000; k++) {
        assert_int_equal(srv_pushid_done(s, k * 0x10000, k), 1);
        assert_int_equal(srv_pushid_done(s, k * 0x10000, k + 1), 0);
    }
    del_psd(s);
}

/* The bound: past SRV_PUSHIDS_MAX clients the one that pushed longest ago
 * is forgotten, and only it; memory stays at most twice the bound's slots. */
static void test_bound_forgets_oldest(void **state)
{
    (void)state;
    psd *s = new_psd();
    for (uint64_t k = 1; k <= SRV_PUSHIDS_MAX; k++)
        srv_pushid_mark(s, k, 100 + k);
    assert_int_equal(srv_pushid_count(s), SRV_PUSHIDS_MAX);
    srv_pushid_mark(s, 1, 500); /* client 1 pushes again: now 2 is the oldest */
    srv_pushid_mark(s, SRV_PUSHIDS_MAX + 1, 9);
    assert_int_equal(srv_pushid_count(s), SRV_PUSHIDS_MAX);
    assert_int_equal(srv_pushid_done(s, 2, 102), 0);        /* forgotten */
    assert_int_equal(srv_pushid_done(s, 1, 500), 1);        /* kept */
    assert_int_equal(srv_pushid_done(s, 3, 103), 1);        /* kept */
    assert_int_equal(srv_pushid_done(s, SRV_PUSHIDS_MAX + 1, 9), 1);
    for (uint64_t k = 3; k <= SRV_PUSHIDS_MAX; k++)
        assert_int_equal(srv_pushid_done(s, k, 100 + k), 1); /* the deletion kept every probe run whole */
    assert_true(s->pushids.cap <= 2 * SRV_PUSHIDS_MAX);
    /* a thousand more: always the oldest goes */
    for (uint64_t k = 0; k < 1000; k++)
        srv_pushid_mark(s, 1000000 + k, 1);
    assert_int_equal(srv_pushid_count(s), SRV_PUSHIDS_MAX);
    assert_int_equal(srv_pushid_done(s, 1, 500), 1); /* marked late: still there */
    for (uint64_t k = 3; k < 1003; k++)
        assert_int_equal(srv_pushid_done(s, k, 100 + k), 0);
    for (uint64_t k = 1003; k <= SRV_PUSHIDS_MAX; k++)
        assert_int_equal(srv_pushid_done(s, k, 100 + k), 1);
    del_psd(s);
}

/* The walk gives every (cid, pid) once; set restores them exactly in
 * another psd (a follower), also lowering a record. */
static void test_walk_and_set(void **state)
{
    (void)state;
    psd *a = new_psd(), *b = new_psd();
    for (uint64_t k = 1; k <= 300; k++)
        srv_pushid_mark(a, k * 7919, k * 3);
    srv_pushid_mark(b, 7919, 1000); /* b's own, to be overwritten */
    uint32_t it = 0, n = 0;
    uint64_t cid, pid, seen = 0;
    while (srv_pushid_next(a, &it, &cid, &pid)) {
        assert_int_equal(cid % 7919, 0);
        assert_int_equal(pid, cid / 7919 * 3);
        seen += cid / 7919;
        assert_int_equal(srv_pushid_set(b, cid, pid), 0);
        n++;
    }
    assert_int_equal(n, 300);
    assert_int_equal(seen, 300 * 301 / 2);
    assert_int_equal(srv_pushid_next(a, &it, &cid, &pid), 0); /* stays at its end */
    assert_int_equal(srv_pushid_count(b), 300);
    assert_int_equal(srv_pushid_done(b, 7919, 3), 1);
    assert_int_equal(srv_pushid_done(b, 7919, 4), 0); /* set, not raised: 1000 is gone */
    assert_int_equal(srv_pushid_set(b, 0, 1), PS_EINVAL);
    assert_int_equal(srv_pushid_set(b, 1, 0), PS_EINVAL);
    /* an empty record walks nothing */
    psd *e = new_psd();
    it = 0;
    assert_int_equal(srv_pushid_next(e, &it, &cid, &pid), 0);
    del_psd(e);
    del_psd(a);
    del_psd(b);
}

/* A bsp round's push ids: done at once (2: a push sent again in the round
 * is not taken twice), out of the record (a checkpoint or a snapshot of the
 * model before the round does not hold them) until the round closes, and
 * forgotten with a dropped round. */
static void test_round_ids(void **state)
{
    (void)state;
    psd *s = new_psd();
    srv_pushid_mark(s, 5, 3); /* an earlier round's */
    srv_pushid_mark_round(s, 5, 4);
    srv_pushid_mark_round(s, 6, 9);
    srv_pushid_mark_round(s, 0, 9); /* an old client: nothing */
    assert_int_equal(srv_pushid_done(s, 5, 3), 1); /* applied */
    assert_int_equal(srv_pushid_done(s, 5, 4), 2); /* counted in the open round */
    assert_int_equal(srv_pushid_done(s, 5, 5), 0);
    assert_int_equal(srv_pushid_done(s, 6, 1), 2);
    assert_int_equal(srv_pushid_done(s, 6, 10), 0);
    /* the record, as a checkpoint walks it: the round's are not there */
    uint32_t it = 0;
    uint64_t cid, pid;
    assert_int_equal(srv_pushid_count(s), 1);
    assert_int_equal(srv_pushid_next(s, &it, &cid, &pid), 1);
    assert_true(cid == 5 && pid == 3);
    srv_pushid_round_closed(s);
    assert_int_equal(srv_pushid_count(s), 2);
    assert_int_equal(srv_pushid_done(s, 5, 4), 1);
    assert_int_equal(srv_pushid_done(s, 6, 9), 1);
    /* a round dropped: its ids are not done any more */
    for (uint64_t i = 1; i <= 40; i++) /* past the first room */
        srv_pushid_mark_round(s, 100 + i, i);
    assert_int_equal(srv_pushid_done(s, 140, 40), 2);
    srv_pushid_round_drop(s);
    assert_int_equal(srv_pushid_done(s, 140, 40), 0);
    assert_int_equal(srv_pushid_done(s, 5, 4), 1);
    srv_pushid_round_closed(s); /* nothing left to record */
    assert_int_equal(srv_pushid_count(s), 2);
    del_psd(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_not_done),
        cmocka_unit_test(test_mark_then_done),
        cmocka_unit_test(test_many_clients),
        cmocka_unit_test(test_bound_forgets_oldest),
        cmocka_unit_test(test_walk_and_set),
        cmocka_unit_test(test_round_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
