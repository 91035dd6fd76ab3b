/* mapkey.h - the job's part map in etcd (mapkey.c; issue 45). */
#ifndef SRV_COORD_MAPKEY_H
#define SRV_COORD_MAPKEY_H

#include "server/coord/coord_int.h"

/* On the coordinator's timer, on a leader: once it serves under a newer
 * map than it last put (a move's end), puts /psd/JOB/map. */
void srv_coord_map_step(srv_coord *k);

#endif
