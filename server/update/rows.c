/* rows.c - a table push's rows stepped by the update layer, as a dense push's
 * range is by update.c: on the loop at once (table_apply = ordered, each
 * row's step through the table's optimizer, tables/table.c), or queued to the
 * apply threads (table_apply = hogwild, tapply.c). The policies of asgd and
 * ssp call it for every table push; bsp for none (its round applies the
 * summed rows as it closes). */
#include "server/replog/replog.h"
#include "server/update/update.h"

int srv_update_rows(psd *s, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g, const srv_row_hint *hint,
                    const srv_tapply_tag *tag, const uint8_t *pkeys, uint32_t npk, char *err, size_t errlen)
{
    if (s->tapply) {
        int rc = srv_tapply_push(s->tapply, &s->tables, ti, keys, n, g, tag, pkeys, npk, err, errlen);
        return rc > 0 ? SRV_PENDING : rc;
    }
    int rc = srv_tables_push_hint(&s->tables, ti, keys, n, g, 1.0, hint, err, errlen);
    if (rc == 0)
        srv_replog_rows(s, ti, keys, n, g, 1.0); /* the followers apply it as it was applied here */
    return rc;
}

int srv_update_rows_checked(const psd *s)
{
    return !s->tapply && s->tables.bounds.admit <= 1;
}
