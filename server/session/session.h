/* session.h - the session layer: a connection's membership (hello.c: the
 * hello in three steps, leaving) and the token challenge (auth.c). */
#ifndef SRV_SESSION_H
#define SRV_SESSION_H

#include "server/store/psd.h"

/* the session layer's files */
#include "server/session/auth.h"
#include "server/session/hello.h"

#endif
