/* model.c - the parameter store: layout, copy-on-write snapshots, the
 * server-side optimizer. Knows nothing of connections or modes. */
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "psd.h"

static srv_snap *snap_new(size_t n)
{
    srv_snap *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    /* 64-byte alignment for vector loads; n rounded up for aligned_alloc */
    size_t bytes = ((n * sizeof(float)) + 63) & ~(size_t)63;
    s->w = aligned_alloc(64, bytes ? bytes : 64);
    if (!s->w) {
        free(s);
        return NULL;
    }
    s->refs = 1;
    s->n = n;
    return s;
}

srv_snap *srv_snap_ref(srv_snap *s)
{
    s->refs++;
    return s;
}

void srv_snap_unref(srv_snap *s)
{
    if (s && --s->refs == 0) {
        free(s->w);
        free(s);
    }
}

int srv_model_set_layout(srv_model *m, const ps_layout *l, const ps_config *cfg)
{
    srv_snap *s = snap_new(l->total);
    if (!s)
        return PS_ENOMEM;
    memset(s->w, 0, l->total * sizeof(float));
    int rc = srv_optim_init(&m->opt, cfg, l->total);
    if (rc != 0) {
        srv_snap_unref(s);
        return rc;
    }
    m->layout = *l;
    m->fp = ps_layout_fingerprint(l);
    m->cur = s;
    m->has_layout = 1;
    m->initialized = 0;
    m->version = 0;
    return 0;
}

float *srv_model_writable(srv_model *m)
{
    srv_snap *cur = m->cur;
    if (cur->refs > 1) {
        srv_snap *s = snap_new(cur->n);
        if (!s)
            return NULL;
        memcpy(s->w, cur->w, cur->n * sizeof(float));
        s->version = cur->version;
        srv_snap_unref(cur);
        m->cur = s;
    }
    return m->cur->w;
}

void srv_model_bump(srv_model *m)
{
    m->version++;
    m->cur->version = m->version;
}

void srv_model_free(srv_model *m)
{
    srv_snap_unref(m->cur);
    m->cur = NULL;
    srv_optim_free(&m->opt);
}
