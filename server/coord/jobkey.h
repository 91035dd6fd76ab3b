/* jobkey.h - the job's record in etcd (jobkey.c; issue 44): a job name
 * held by another job is refused at start. */
#ifndef SRV_COORD_JOBKEY_H
#define SRV_COORD_JOBKEY_H

#include <stdint.h>

#include "server/coord/coord_int.h"

/* Names the job's keys (k->s->cfg.job set, checked). */
void srv_coord_job_init(srv_coord *k);
/* On the coordinator's timer until k->job.ok: reads the job's record and
 * writes it, or finds it this job's (ok), or another live job's (logged;
 * psd stops, exit status 1). */
void srv_coord_job_step(srv_coord *k, uint64_t now);

#endif
