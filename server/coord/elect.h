/* elect.h - which candidate goes first (elect.c; issue 44): each follower
 * publishes how much of its leader's log it holds, and a candidate defers
 * to an in-sync peer that holds more. */
#ifndef SRV_COORD_ELECT_H
#define SRV_COORD_ELECT_H

#include <stdint.h>

#include "server/coord/coord_int.h"

/* The peer a candidate at position pos of leader's log defers to: among
 * peers[0..n) the one the in-sync list insync ("ADDR,ADDR") names, that
 * follows the same leader and holds more of its log than pos, or as much
 * with a lower address than self (the newest such, the lowest address
 * among equals); -1 when there is none and the candidate goes first. */
int srv_coord_newer_peer(const srv_coord_peer *peers, int n, const char *insync, const char *self,
                         const char *leader, uint64_t pos);

/* On a candidate follower (coord.c: the key gone, max_replica_lag of
 * silence): 1 while it waits for a newer in-sync peer, as k->peer last
 * read, to take the key (logged); for lease_ttl at most, and for a second
 * of silence at least, so that the peers' last positions are in etcd. */
int srv_coord_defer(srv_coord *k, uint64_t now);
/* A follower's position key: its name in the part's keys (k->pfx) set up. */
void srv_coord_pos_init(srv_coord *k);
/* On the coordinator's timer, on a follower: keeps its position key,
 * "POSITION LEADER", under a lease of its own (lease_ttl, renewed every
 * third of it), put again when its applied position changed (at most every
 * SRV_COORD_PUT_MS). */
void srv_coord_pos_step(srv_coord *k, uint64_t now);
#define SRV_COORD_PUT_MS 250
/* A position key read (name: what follows "pos/"; val: its value) into
 * k->peer; k->npeers counts them (at most SRV_COORD_PEERS_MAX). */
void srv_coord_peer_read(srv_coord *k, const char *name, const char *val);

#endif
