/* conn_form.h - inside the blocking connection (conn.c, conn_form.c): the
 * form a message's tensor is sent in. Not for conn.h's users. */
#ifndef PS_CONN_FORM_H
#define PS_CONN_FORM_H

#include <stddef.h>

#include "conn.h"

/* Room for n values of esize bytes in *p (capacity *cap values, kept for
 * reuse). 0, or PS_ENOMEM with the reason in c's error. */
int ps_conn_grow(ps_conn *c, void **p, size_t *cap, size_t n, size_t esize);

/* Puts *mp in the form it travels in: with wire_dt bf16 a float32 push's
 * data narrowed (into c->narrow) and its reply asked for in bfloat16; with
 * compress the reply's parameters asked for compressed and a float32
 * tensor compressed (into c->zbuf) when that is worth it; else with
 * skip_zeros its zeros left out when that is worth it. A changed message
 * is built in *nm and *mp then points at it: the caller's message keeps
 * its float32 data (it may send it again), but may gain the reply's rdt.
 * 0, or a PS_E* code with the reason in c's error. */
int ps_conn_form(ps_conn *c, ps_msg **mp, ps_msg *nm);

#endif
