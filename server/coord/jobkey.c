/* jobkey.c - the job's record in etcd (issue 44): a job name held by
 * another job is refused at start, before this psd leads or follows
 * anything of it.
 *
 * /psd/JOB/job (no lease) holds the settings every psd of the job shares
 * and none can change while it runs (JOB_SETTINGS that a reload leaves
 * alone), as "NAME=VALUE NAME=VALUE ...", then " by ADDR": the psd that
 * wrote it. The coordinator's first request (coord.c waits for it) reads
 * the record and the job's part keys (/psd/JOB/part/...):
 * - no record: this psd writes it, in a transaction that writes only while
 *   there is still none (its create revision 0), and reads again;
 * - the same settings: this psd is one of the job's; coord.c goes on;
 * - other settings while a part key is held under a lease (a psd of that
 *   job leads a part or follows one): another job holds the name; this psd
 *   says which settings differ and who holds the keys, and stops, exit
 *   status 1 (joining it would follow another model, and send this job's
 *   workers to its leaders);
 * - other settings and no leased key: the job that wrote it is over (its
 *   leases lapsed); this psd writes its own, in a transaction that writes
 *   only while the record is as read (its mod revision).
 * A request no etcd member answers is asked again after RETRY_MS
 * (reach.c logs it once); meanwhile the psd acknowledges no push, as
 * before it holds a lease. */
#include "server/coord/jobkey.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "server/config/config.h"
#include "server/record/stats.h"

#define RETRY_MS 1000

/* Set at start and kept for the job's life; a setting a reload changes is
 * left out (ps_config_reloadable), so that a reloaded job's psd still agree. */
static const char *const JOB_SETTINGS[] = {"mode", "workers", "optimizer", "replication", "hogwild", "table_apply"};

/* This psd's record: "NAME=VALUE ..." */
static void settings_text(const psd *s, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof JOB_SETTINGS / sizeof *JOB_SETTINGS && n < len; i++) {
        const ps_config_option *o = ps_config_find(JOB_SETTINGS[i]);
        char v[128];
        if (!o || ps_config_reloadable(o) || ps_config_format(&s->cfg, o, v, sizeof v) < 0)
            continue;
        n += (size_t)snprintf(out + n, len - n, "%s%s=%s", n ? " " : "", o->name, v);
    }
}

static void ask_again(srv_coord *k, const char *err)
{
    srv_coord_unreached(k, err);
    k->job.next_ms = srv_now_ms() + RETRY_MS;
}

static void put_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)a, (void)sent_ms;
    srv_coord *k = arg;
    k->job.busy = 0;
    if (k->stopped)
        return;
    if (!ok)
        ask_again(k, err);
    /* written, or another psd wrote first: read it again either way */
}

/* Writes this psd's record if the record is still at revision rev (its
 * mod revision; 0: there is none). */
static void put_record(srv_coord *k, int64_t rev)
{
    char val[900], v64[1300], body[3000];
    settings_text(k->s, val, sizeof val);
    snprintf(val + strlen(val), sizeof val - strlen(val), " by %s", k->self);
    srv_b64_encode(val, strlen(val), v64);
    snprintf(body, sizeof body,
             "{\"compare\":[{\"target\":\"%s\",\"key\":\"%s\",\"%s\":\"%" PRId64 "\"}],"
             "\"success\":[{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\"}}]}",
             rev ? "MOD" : "CREATE", k->job.key64, rev ? "modRevision" : "createRevision", rev, k->job.key64, v64);
    k->job.busy = 1;
    if (srv_etcd_call(k->etcd, "/v3/kv/txn", body, put_done, k) != 0)
        k->job.busy = 0;
}

/* The settings of a record (what comes before " by "). */
static void record_settings(const char *rec, char *out, size_t len)
{
    const char *by = strstr(rec, " by ");
    size_t n = by ? (size_t)(by - rec) : strlen(rec);
    snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), rec);
}

/* A range's kvs in a transaction's answer: responses[i].response_range.kvs. */
static json_t *txn_kvs(json_t *a, size_t i)
{
    json_t *rs = json_object_get(a, "responses");
    json_t *r = json_is_array(rs) ? json_object_get(json_array_get(rs, i), "response_range") : NULL;
    json_t *kvs = r ? json_object_get(r, "kvs") : NULL;
    return json_is_array(kvs) ? kvs : NULL;
}

static void refuse(srv_coord *k, const char *rec, const char *mine, const char *holder)
{
    psd *s = k->s;
    PS_LOG(PS_LOG_ERROR, "coordinator: job \"%s\" is held by another job: etcd's /psd/%s/job says %s, this psd's "
           "settings are %s, and that job's psd still hold its keys (%s). Give this job a name of its own (job = "
           "NAME), or stop that job first: its record goes once its leases have lapsed", s->cfg.job, s->cfg.job, rec,
           mine, holder);
    s->refused = 1; /* psd stops at the next step: not from etcd's callback, whose client the stop closes */
}

static void read_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)sent_ms;
    srv_coord *k = arg;
    k->job.busy = 0;
    if (k->stopped)
        return;
    if (!ok) {
        ask_again(k, err);
        return;
    }
    srv_coord_reached(k);
    json_t *rec = txn_kvs(a, 0), *parts = txn_kvs(a, 1);
    json_t *kv = rec ? json_array_get(rec, 0) : NULL;
    if (!kv) {
        put_record(k, 0);
        return;
    }
    char val[900], theirs[900], mine[900];
    srv_etcd_kv_value(kv, val, sizeof val);
    record_settings(val, theirs, sizeof theirs);
    settings_text(k->s, mine, sizeof mine);
    if (strcmp(theirs, mine) == 0) {
        k->job.ok = 1;
        PS_LOG(PS_LOG_INFO, "coordinator: job \"%s\" in etcd: %s", k->s->cfg.job, val);
        return;
    }
    /* a part key under a lease: a live psd of the job that wrote the record */
    char key[400] = "", holder[800] = "";
    for (size_t i = 0; parts && i < json_array_size(parts); i++) {
        json_t *p = json_array_get(parts, i);
        if (!srv_etcd_int(p, "lease"))
            continue;
        const char *k64 = srv_etcd_str(p, "key");
        char v[400];
        if (!k64 || srv_b64_decode(k64, key, sizeof key) < 0)
            continue;
        srv_etcd_kv_value(p, v, sizeof v);
        snprintf(holder, sizeof holder, "%s: %s", key, v);
        break;
    }
    if (holder[0]) {
        refuse(k, val, mine, holder);
        return;
    }
    PS_LOG(PS_LOG_WARN, "coordinator: job \"%s\"'s record in etcd (%s) is of a job with no psd left (no part key "
           "under a lease): this job takes the name", k->s->cfg.job, val);
    put_record(k, srv_etcd_int(kv, "mod_revision"));
}

void srv_coord_job_init(srv_coord *k)
{
    char path[300];
    snprintf(path, sizeof path, "/psd/%s/job", k->s->cfg.job);
    srv_b64_encode(path, strlen(path), k->job.key64);
    snprintf(path, sizeof path, "/psd/%s/part/", k->s->cfg.job);
    srv_b64_encode(path, strlen(path), k->job.parts64);
    snprintf(path, sizeof path, "/psd/%s/part0", k->s->cfg.job); /* '0' follows '/' */
    srv_b64_encode(path, strlen(path), k->job.end64);
}

void srv_coord_job_step(srv_coord *k, uint64_t now)
{
    if (k->s->refused) {
        if (k->s->shutdown)
            k->s->shutdown(k->s, "the job's name is another job's");
        return;
    }
    if (k->job.ok || k->job.busy || now < k->job.next_ms)
        return;
    char body[2000];
    snprintf(body, sizeof body,
             "{\"compare\":[],\"success\":[{\"requestRange\":{\"key\":\"%s\"}},"
             "{\"requestRange\":{\"key\":\"%s\",\"range_end\":\"%s\",\"limit\":\"64\"}}]}",
             k->job.key64, k->job.parts64, k->job.end64);
    k->job.busy = 1;
    if (srv_etcd_call(k->etcd, "/v3/kv/txn", body, read_done, k) != 0)
        k->job.busy = 0;
}
