/* status.h - what psd reports (status.c): the status map and the
 * Prometheus text. */
#ifndef SRV_STATUS_H
#define SRV_STATUS_H

#include "server/store/psd.h"

/* status.c */
int srv_pack_status(msgpack_packer *pk, void *arg);
int srv_metrics_text(psd *s, ps_buf *out);

#endif
