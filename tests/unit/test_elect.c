/* test_elect.c - unit tests for server/coord/elect.c: which in-sync peer a
 * candidate defers to (the newest of the same leader's log, the lowest
 * address among equals), and the position keys read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "server/coord/elect.h"

static srv_coord_peer peer(const char *addr, uint64_t pos, const char *leader)
{
    srv_coord_peer p;
    memset(&p, 0, sizeof p);
    snprintf(p.addr, sizeof p.addr, "%s", addr);
    snprintf(p.leader, sizeof p.leader, "%s", leader);
    p.pos = pos;
    return p;
}

#define L "10.0.0.1:7000"
#define A "10.0.0.2:7000"
#define B "10.0.0.3:7000"
#define C "10.0.0.4:7000"

static void test_the_newest_goes_first(void **state)
{
    (void)state;
    srv_coord_peer p[] = {peer(A, 100, L), peer(B, 200, L), peer(C, 150, L)};
    /* B, newest: defers to nobody; A and C defer to B */
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, B, L, 200), -1);
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, A, L, 100), 1);
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, C, L, 150), 1);
    /* its own live position counts, not the one it published */
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, A, L, 300), -1);
}

static void test_ties_go_to_the_lowest_address(void **state)
{
    (void)state;
    srv_coord_peer p[] = {peer(C, 200, L), peer(A, 200, L), peer(B, 200, L)};
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, A, L, 200), -1);
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, B, L, 200), 1);
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B "," C, C, L, 200), 1);
}

static void test_only_in_sync_peers_of_the_same_leader_count(void **state)
{
    (void)state;
    /* B is newer but not in sync; C follows another leader's log */
    srv_coord_peer p[] = {peer(B, 900, L), peer(C, 900, "10.0.0.9:7000"), peer(A, 100, L)};
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," C, A, L, 100), -1);
    assert_int_equal(srv_coord_newer_peer(p, 3, A "," B, A, L, 100), 0);
    /* a prefix of an address in the list is not the address */
    srv_coord_peer q[] = {peer("10.0.0.3:700", 900, L)};
    assert_int_equal(srv_coord_newer_peer(q, 1, A "," B, A, L, 100), -1);
    assert_int_equal(srv_coord_newer_peer(NULL, 0, "", A, L, 0), -1);
}

static void test_position_keys_read(void **state)
{
    (void)state;
    static srv_coord k; /* large */
    memset(&k, 0, sizeof k);
    srv_coord_peer_read(&k, A, "123 " L);
    srv_coord_peer_read(&k, B, "not a position");
    srv_coord_peer_read(&k, C, "77");
    assert_int_equal(k.npeers, 1);
    assert_string_equal(k.peer[0].addr, A);
    assert_string_equal(k.peer[0].leader, L);
    assert_int_equal(k.peer[0].pos, 123);
    for (int i = 0; i < 2 * SRV_COORD_PEERS_MAX; i++)
        srv_coord_peer_read(&k, B, "1 " L);
    assert_int_equal(k.npeers, SRV_COORD_PEERS_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_newest_goes_first),
        cmocka_unit_test(test_ties_go_to_the_lowest_address),
        cmocka_unit_test(test_only_in_sync_peers_of_the_same_leader_count),
        cmocka_unit_test(test_position_keys_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
