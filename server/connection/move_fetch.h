/* move_fetch.h - a destination's fetching of rows in a move of parts
 * (move_fetch.c). */
#ifndef SRV_CONNECTION_MOVE_FETCH_H
#define SRV_CONNECTION_MOVE_FETCH_H

#include "server/store/psd.h"

/* Registers psd.move_start and psd.move_stop (at psd's start). */
void srv_move_fetch_init(psd *s);
/* Stops the fetching threads and waits for them (move_end, shutdown). */
void srv_move_fetch_stop(psd *s);
/* Closes the handle that drops the rows a move took away (shutdown). */
void srv_move_drop_close(psd *s);

#endif
