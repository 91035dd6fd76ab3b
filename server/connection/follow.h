/* follow.h - a follower's side of replication (follow.c). */
#ifndef SRV_CONNECTION_FOLLOW_H
#define SRV_CONNECTION_FOLLOW_H

#include <stddef.h>

#include "server/store/psd.h"

/* With replica_of set: starts following that leader (psd.follow, and
 * psd.promote for psctl promote). After srv_listen (it advertises the bound
 * port). 0, or a negative PS_E* code with err. */
int srv_follow_start(psd *s, char *err, size_t errlen);
/* Stops the thread (at shutdown). */
void srv_follow_stop(psd *s);
/* Frees what is left (at exit, after the loop). */
void srv_follow_free(psd *s);

#endif
