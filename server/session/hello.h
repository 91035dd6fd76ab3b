/* hello.h - a connection's membership (hello.c): the hello in three steps
 * (check, join, welcome), leaving, shards that never joined. */
#ifndef SRV_SESSION_HELLO_H
#define SRV_SESSION_HELLO_H

#include "server/store/psd.h"

/* The checks of a hello that need nothing of the job: not a second one,
 * the protocol version. 0, or a negative PS_E* code with err filled. */
int srv_hello_precheck(const srv_conn *c, const ps_msg *m, char *err, size_t errlen);
/* Every check of hello m on c against the job (shard, BSP's worker count,
 * max_params, layout), changing nothing. 0, or a code with err filled. */
int srv_hello_check(const psd *s, const srv_conn *c, const ps_msg *m, char *err, size_t errlen);
/* Joins a checked hello: fixes the layout (the first worker's), registers
 * the worker and tells the policy (answering the pulls that woke), maps a
 * shared segment offered; sets c's role. *need_init: c is to send the
 * initial values. 0, or a code with err filled. */
int srv_hello_join(srv_conn *c, const ps_msg *m, int *need_init, char *err, size_t errlen);
/* Queues the WELCOME to a joined hello of request id, with sproof
 * (PS_AUTH_MAC_LEN bytes) when it is not NULL. */
void srv_hello_welcome(srv_conn *c, uint64_t id, int need_init, const uint8_t *sproof);
/* check, join, welcome: for a hello that needed no authentication, or
 * whose AUTH has been verified. Returns 0 with the WELCOME queued, or the
 * check's or join's PS_E* code with err filled and nothing sent (the caller
 * sends the ERROR: fatal but for PS_ESTATE, a second hello). */
int srv_hello_accept(srv_conn *c, const ps_msg *m, const uint8_t *sproof, char *err, size_t errlen);
/* A connection is going away: detach it from its worker (telling the
 * policy), drop its pulls. */
void srv_conn_detach(srv_conn *c, int state, const char *why);

/* Shard shard (below M) never joined within join_timeout: it is recorded
 * as a lost worker with the reason why, and the policy told, exactly as
 * for a worker that died (its data is then shared by the others). */
void srv_worker_never_joined(psd *s, uint32_t shard, const char *why);

/* At start, after a checkpoint's plan was restored (srv_checkpoint_load):
 * records the shards that had left its job or been lost when it was
 * written (s->plan.out) as lost, so the rounds do not wait for them (no
 * policy runs yet); each may join again. Out of memory a shard is logged
 * and waited for. Empties the list. */
void srv_workers_out_restored(psd *s);

/* The INIT of the initial values is done: nobody is asked for them. */
void srv_init_owner_done(psd *s);

/* psctl reset: forgets every worker record (their connections already
 * detached), the job's shard count, who initialises the model and the
 * "model only in memory" warning, as at start. */
void srv_workers_forget(psd *s);

/* On psd's tick: starts the wait when shards are missing (join.h), logs
 * whom it waits for every SRV_JOIN_WARN_MS, and at join_timeout declares
 * the missing shards lost (continue) or stops the job (stop). */
void srv_join_tick(psd *s, uint64_t now);

#endif
