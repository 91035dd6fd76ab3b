/* reshard.h - a job's state for a new number of psd parts, offline (psd
 * --reshard-from, PROTOCOL.md 13.7 and section 6.2). */
#ifndef SRV_RESHARD_H
#define SRV_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "server/store/psd.h"

/* Fills s (a psd not serving yet, its model and tables empty, its settings
 * the old parts' psd's) with part `part` of `nparts` of the job whose old
 * parts' state dirs `from` lists, comma-separated, in part order: the
 * newest checkpoint of each is read; the dense model, joined and cut again
 * by the split rules (section 6.2), with its optimizer state; every table
 * row whose key's part (13.7) is `part`, with its optimizer state, bit for
 * bit; the newest version of the old parts; old part 0's plan. The caller
 * writes it (srv_checkpoint_write_now). Returns 0, or a code with err: an
 * old dir without a checkpoint, a part missing or out of order, tables that
 * differ, a key in two parts, a model too small for nparts. */
int srv_reshard(psd *s, const char *from, uint32_t part, uint32_t nparts, char *err, size_t errlen);

#endif
