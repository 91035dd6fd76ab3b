/* coord_int.h - the coordinator's state, shared by the files of coord/:
 * coord.c (the lease, the election, the fence), handback.c (a leader
 * stopped by a signal hands its part back), elect.c (the followers'
 * positions, and which candidate goes first) and jobkey.c (the job's
 * record: a job name held by another job). Calls go one way: coord.c
 * calls elect.c and jobkey.c, jobkey.c calls coord.c's reached and
 * unreached; handback.c, called by main, reads and writes this state and
 * calls neither. */
#ifndef SRV_COORD_COORD_INT_H
#define SRV_COORD_COORD_INT_H

#include <stdint.h>

#include <uv.h>

#include "server/coord/etcd.h"
#include "server/store/psd.h"

#define SRV_COORD_PEERS_MAX 8 /* followers' position keys read per part */

/* A follower's position key, /psd/JOB/part/N/pos/ADDR = "POSITION LEADER"
 * (under the follower's own lease): how much of LEADER's log it holds. */
typedef struct srv_coord_peer {
    char addr[300];
    char leader[300];
    uint64_t pos;
} srv_coord_peer;

/* elect.c's: this follower's position key and its lease. */
typedef struct srv_coord_pos {
    char key64[600];         /* its key, base64 */
    char lease[32];          /* its lease ("" none) */
    uint64_t next_renew_ms;  /* when the lease is renewed next */
    uint64_t next_put_ms;    /* not put again before this */
    uint64_t put;            /* the position last put (+1; 0: none) */
    char put_leader[300];    /* and of whose log */
    int busy;                /* a request in flight */
    uint64_t defer_since;    /* a candidate deferring to a newer peer since (0: not) */
    char deferred_to[300];   /* to whom (logged once) */
} srv_coord_pos;

/* jobkey.c's: the job's record, checked before anything else. */
typedef struct srv_coord_job {
    int ok;                  /* the record is this job's: coord.c may go on */
    int busy;                /* a request in flight */
    uint64_t next_ms;        /* not asked again before this */
    char key64[420];         /* /psd/JOB/job, base64 */
    char parts64[420];       /* the job's part keys' prefix, /psd/JOB/part/, base64 */
    char end64[420];         /* and the end of its range, base64 */
} srv_coord_job;

/* srv_coord.hb_stage: a leader handing its part back (handback.c) */
enum { SRV_HB_NONE = 0, HB_DRAIN, HB_DELETING, HB_REVOKING, HB_OVER };

typedef struct srv_coord {
    psd *s;
    srv_etcd *etcd;
    uv_timer_t timer;
    char self[300];          /* where workers reach this psd */
    char key64[420];         /* the key, base64 */
    char ikey64[420];        /* the in-sync key, /psd/JOB/part/N/insync, base64 */
    char hkey64[420];        /* the hand-back key, /psd/JOB/part/N/handback, base64 */
    char pfx[300];           /* the part's keys' prefix, /psd/JOB/part/N/ */
    char pfx64[420];         /* and base64 */
    char end64[420];         /* the end of the part's keys' range, base64 */
    int64_t insync_rev;      /* the in-sync key's mod revision as last read (0: none) */
    uint32_t sending_mask;   /* the in-sync set a publish in flight writes */
    char lease[32];          /* our lease's ID, decimal ("" none) */
    uint64_t grant_ms;       /* when the lease's grant was sent */
    int64_t create_rev;      /* our key's create revision */
    uint64_t next_renew_ms, next_read_ms;
    int renewing, reading, campaigning, publishing;
    int listed;              /* the in-sync key, last read, names this psd */
    char insync_seen[600];   /* that value's in-sync list */
    int said_unreachable, said_own_key;
    uint64_t absent_ms;      /* when a psd that saw its own old key first found it gone */
    int keep;                /* campaigning to keep leading (our own lease lapsed) */
    int stopped;
    /* handback.c's: a leader handing its part back (psd.coord.handing_back) */
    uv_timer_t hb_timer;
    int hb_timer_on;         /* hb_timer is initialised (closed at stop) */
    int hb_stage;            /* HB_*: past HB_DRAIN the key is being given up: coord.c does nothing */
    uint64_t hb_deadline;    /* draining ends by this time, the followers caught up or not */
    void (*hb_done)(psd *s); /* called once it is over */
    /* elect.c's */
    srv_coord_pos pos;
    srv_coord_peer peer[SRV_COORD_PEERS_MAX];
    int npeers;              /* the position keys last read */

    srv_coord_job job;       /* jobkey.c's: the job's record */
    int map_busy;            /* mapkey.c's: a put of the part map in flight */
    uint64_t map_sending;    /* its epoch */
} srv_coord;

/* coord.c's: etcd answered a request, or no member did (err): logged
 * once, and shown in status and metrics (psd.coord). */
void srv_coord_reached(srv_coord *k);
void srv_coord_unreached(srv_coord *k, const char *err);

#endif
