/* shm.h - shared memory with a local worker (shm.c). */
#ifndef SRV_STORE_SHM_H
#define SRV_STORE_SHM_H

#include "server/store/psd.h"

/* Models up to this size may use it: one block, so a reply's copy into the
 * segment is at most 4 MiB on the event loop. */
#define SRV_SHM_MAX_PARAMS SRV_BLK_FLOATS
/* An rdt value that never comes off the wire: answer into the segment. */
#define SRV_RDT_SHM 0x100u

/* Maps the segment a worker's hello offers (m's "shm": /proc/<pid>/fd/<fd>)
 * when it is a memfd sealed against shrinking and growing that holds the
 * gradient and the parameters, nparams floats each, where the hello says
 * (by default [0, nparams) and [nparams, 2 nparams) of a memfd of exactly
 * that size). 0, or -1 with the reason in why. */
int srv_shm_attach(srv_conn *c, const ps_msg *m, uint64_t nparams, char *why, size_t whylen);
/* Maps the table segment a worker's hello offers (m's "tshm", PROTOCOL.md
 * 13.9) whole, when it is such a memfd of PS_TSEG_MIN..PS_TSEG_MAX bytes,
 * a multiple of 8. 0, or -1 with the reason in why. */
int srv_tshm_attach(srv_conn *c, const ps_msg *m, char *why, size_t whylen);
/* Unmaps both segments. */
void srv_shm_detach(srv_conn *c);

#endif
