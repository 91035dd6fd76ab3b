/* tell.h - a follower promoted by hand tells the leader it followed to
 * step down (tell.c). */
#ifndef SRV_CONNECTION_TELL_H
#define SRV_CONNECTION_TELL_H

#include <stdint.h>

#include "common/auth.h"

/* Starts telling the psd at leader, from a detached thread of its own, for
 * up to 30 s: ADMIN step_down with self (where workers reach this psd) and
 * hist, the history id of the log this psd followed; token proves who
 * asks. Logs the outcome; returns at once. */
void srv_tell_step_down(const char *leader, const char *self, const ps_token *token, uint64_t hist);

#endif
