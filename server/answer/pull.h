/* pull.h - pulls (of the model's values, or of a table's rows): answered now, parked until their version, answered when a
 * policy wakes them; pinned snapshots (pull.c). */
#ifndef SRV_ANSWER_PULL_H
#define SRV_ANSWER_PULL_H

#include "server/store/psd.h"

/* A pull of [off, off+len) for version >= min, answered in element type
 * rdt: answered now or parked (0), or refused: a negative PS_E* code with
 * err filled and nothing sent (the dispatch layer sends the ERROR). */
int srv_pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt, char *err,
             size_t errlen);
/* A pull of the rows of n keys of table ti (PROTOCOL.md 13) for version
 * >= min: answered now with a ROWS or parked, keys copied (0), or refused
 * (PS_ELIMIT: too many parked; PS_ENOMEM) with err filled and nothing
 * sent. rdt SRV_RDT_SHM: the rows go into the connection's table segment
 * from byte rat (13.9), which the caller checked. */
int srv_tpull(srv_conn *c, uint64_t id, uint32_t ti, const uint8_t *keys, uint32_t n, uint64_t min, uint32_t rdt,
              uint64_t rat, char *err, size_t errlen);
/* A pull of table ti's stored rows [off, off+len) by position (creation
 * order), answered at once with a ROWS that carries their keys too (0), or
 * refused (PS_ERANGE: past the rows; PS_EBAD_FIELD: over the limits of one
 * message; PS_ENOMEM) with err filled and nothing sent. */
int srv_tpull_at(srv_conn *c, uint64_t id, uint32_t ti, uint64_t off, uint64_t len, char *err, size_t errlen);
/* 0 when psd may answer in element type rdt; else PS_EUNSUPPORTED with err. */
int srv_pull_check_rdt(const psd *s, uint32_t rdt, char *err, size_t errlen);
/* A push's OK kept until version min is there (a bsp round's last push
 * on a leader with followers: acknowledged once the round closed), in
 * order with c's parked pulls: 0, or PS_ELIMIT / PS_ENOMEM with err
 * filled and nothing kept. */
int srv_ok_after(srv_conn *c, uint64_t id, uint64_t min, char *err, size_t errlen);
/* Answers every parked pull whose version is now available. */
void srv_answer_parked(psd *s);
/* Answers c's parked pulls that can be answered. */
void srv_conn_answer_parked(srv_conn *c);
/* Answers each of c's parked pulls with an ERROR code and text, and
 * forgets them (a reset drops the model they wait for). */
void srv_pulls_refuse(srv_conn *c, int code, const char *text);
/* Drops c's parked pulls and pinned snapshot (it goes away). */
void srv_pulls_drop(srv_conn *c);
/* Frees the parked-pull entries kept for reuse (at exit). */
void srv_parked_free_spare(void);

#endif
