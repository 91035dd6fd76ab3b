/* apply.h - what ASGD and SSP share (apply.c): a push applied as it
 * arrives, and ASGD's state (DC-ASGD's base snapshots, the scratch buffer
 * staleness scaling and DC-ASGD write into). Private to the policy layer:
 * the other layers see the policies through policy.h. */
#ifndef SRV_POLICY_APPLY_H
#define SRV_POLICY_APPLY_H

#include "server/policy/policy.h"

/* ASGD's own state (psd.policy_state in asgd mode): what staleness scaling
 * and DC-ASGD need. */
typedef struct srv_asgd_state {
    float *scratch;      /* model-sized: a push's transformed gradient */
    srv_snap **base;     /* DC-ASGD: per shard, the parameters that worker last
                          * pulled (NULL: none) */
    uint32_t nbase;
} srv_asgd_state;

/* s->policy_state as ASGD's, made on first use; NULL when out of memory. */
srv_asgd_state *srv_asgd_get(psd *s);
/* The snapshot worker w last pulled (DC-ASGD), NULL: none. */
srv_snap *srv_asgd_base(psd *s, const srv_worker *w);
/* Forgets w's base snapshot. */
void srv_asgd_drop_base(psd *s, const srv_worker *w);
/* Applies p's gradient to its range now, as ASGD and SSP do; compensate:
 * staleness scaling and DC-ASGD (asgd only). Returns 0, SRV_WAKE (a fin
 * chunk: a new version), SRV_PENDING, or a negative PS_E* code with err
 * filled. */
int srv_apply_now(psd *s, srv_worker *w, const srv_push *p, int compensate, char *err, size_t errlen);
/* The tpush hook of ASGD and SSP: a table push's rows stepped as it
 * arrives, through the update layer (srv_update_rows: on the loop, or by
 * the apply threads, SRV_PENDING). */
int srv_apply_table(psd *s, srv_worker *w, const srv_tpush *p, char *err, size_t errlen);
/* Their tpush_checks hook: the rows are stepped on the loop, each result
 * checked (srv_update_rows_checked). */
int srv_apply_table_checks(const psd *s);
/* The settings a mode without rounds cannot have (local_steps), and with
 * clocks (ssp: elastic averaging, hogwild): PS_EINVAL with err, or 0. */
int srv_apply_check(const ps_config *c, int clocks, char *err, size_t errlen);
/* The applied() hook of ASGD and SSP: an update a push started off the
 * loop is in. */
int srv_step_applied(psd *s, const srv_update_tag *tag);

#endif
