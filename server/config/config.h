/* config.h - psd's configuration: the options, their defaults and parsing.
 *
 * struct ps_config holds one field per option. config.c has one table with
 * one row per option (name, type, bounds, default as text, where it lands in
 * ps_config, a paragraph of help, and two hooks: validate (parse and range)
 * and apply (what a change at run time does; none: it needs a restart));
 * every function here is driven by that table, so adding an option is adding a
 * field and a row (and a paragraph in conf/psd.conf, which a unit test
 * checks).
 *
 * A ps_config is a plain value: no pointers, strings live in fixed arrays.
 * Copy it with `=`; there is nothing to free.
 *
 * Functions return 0 or a negative PS_E* code (proto/errors.h) and, on
 * error, write a message for a person into err (which may be NULL). */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/hostport.h"

#define PS_CONFIG_HOST_MAX PS_HOSTPORT_HOST_MAX /* host name or address, NUL included */
#define PS_CONFIG_PATH_MAX 1024    /* path options, NUL included */
#define PS_CONFIG_VALUE_MAX 1100   /* enough for any formatted value */

/* Values of ps_config.mode; the order is that of the words in the table. */
enum ps_mode { PS_MODE_ASGD = 0, PS_MODE_BSP = 1, PS_MODE_SSP = 2 };

/* Values of ps_config.lr_schedule. */
enum ps_lr_schedule { PS_LR_CONSTANT = 0, PS_LR_STEP = 1, PS_LR_COSINE = 2 };

/* Values of ps_config.nonfinite. */
enum ps_nonfinite { PS_NONFINITE_REJECT = 0, PS_NONFINITE_CLIP = 1 };

/* Values of ps_config.bsp_sum_order. */
enum ps_bsp_sum_order { PS_BSP_SUM_SHARD = 0, PS_BSP_SUM_ARRIVAL = 1 };

/* Values of ps_config.join_timeout_action. */
enum ps_join_action { PS_JOIN_CONTINUE = 0, PS_JOIN_STOP = 1 };
/* Values of ps_config.hogwild_remote: what becomes of a Hogwild! job's
 * workers on other machines. */
enum ps_hogwild_remote { PS_HOGWILD_REMOTE_ASGD = 0, PS_HOGWILD_REMOTE_REFUSE = 1 };

/* Values of ps_config.table_apply: how psd applies the rows of table
 * pushes in asgd and ssp. */
enum ps_table_apply { PS_TABLE_APPLY_ORDERED = 0, PS_TABLE_APPLY_HOGWILD = 1 };
enum ps_replication { PS_REPLICATION_SYNC = 0, PS_REPLICATION_ASYNC = 1 };
/* Values of ps_config.table_full: what a table push past a table cap
 * (table_memory, max_table_memory) meets (tables/bounds.c). */
enum ps_table_full { PS_TABLE_FULL_REFUSE = 0, PS_TABLE_FULL_EVICT = 1 };

/* The most apply threads table_threads may ask for. */
#define PS_TABLE_THREADS_MAX 64

typedef struct ps_config {
    ps_hostport listen;                /* address psd listens on */
    int mode;                          /* enum ps_mode */
    int workers;                       /* M: pushes that close a BSP round */
    char state_dir[PS_CONFIG_PATH_MAX];/* checkpoints and state; "" = none */
    char init_from[PS_CONFIG_PATH_MAX];/* start from this safetensors file; "" = none */
    char port_file[PS_CONFIG_PATH_MAX];/* write the bound port here; "" = don't */
    char metrics_listen[PS_CONFIG_HOST_MAX + 8]; /* HTTP /metrics address; "" = off */
    char token_file[PS_CONFIG_PATH_MAX];       /* the workers' secret; "" = no authentication */
    char admin_token_file[PS_CONFIG_PATH_MAX]; /* the admins' secret; "" = admins read only */
    bool allow_remote_without_token;   /* listen beyond loopback without token_file */
    int optimizer;                     /* enum ps_optimizer_kind (server/model/optim.h) */
    double lr;                         /* learning rate */
    double momentum;                   /* SGD momentum */
    double weight_decay;               /* L2 weight decay */
    bool nesterov;                     /* Nesterov momentum (sgd) */
    double beta1, beta2, eps;          /* Adam/AdamW moments; eps also AdaGrad's */
    double clip_norm;                  /* clip each update's gradient to this L2 norm; 0 = off */
    int nonfinite;                     /* enum ps_nonfinite: NaN/inf pushes refused or sanitised */
    int lr_schedule;                   /* enum ps_lr_schedule */
    uint64_t lr_step_size;             /* step: versions between decays */
    double lr_gamma;                   /* step: factor per decay */
    uint64_t lr_decay_versions;        /* cosine: versions from lr to lr_min */
    double lr_min;                     /* cosine: floor */
    uint64_t warmup_versions;          /* linear warm-up from 0 to lr */
    int bsp_sum_order;                 /* enum ps_bsp_sum_order */
    int backup_workers;                /* bsp: a round closes after M - b pushes */
    uint64_t bsp_piece;                /* bsp: values a piece of a round that closes piece by
                                        * piece; 0 = the whole model at once */
    int staleness;                     /* ssp: clocks a worker may run ahead */
    bool staleness_scale;              /* asgd: scale a push's step by 1/(1+staleness) */
    double dc_lambda;                  /* asgd: DC-ASGD delay compensation; 0 = off */
    int local_steps;                   /* bsp: local SGD, H local steps a round; 0 = off */
    double elastic_alpha;              /* asgd: elastic averaging's alpha; 0 = off */
    int elastic_tau;                   /* asgd: local steps between elastic exchanges */
    uint64_t heartbeat_timeout;        /* ms of silence before a worker is dead */
    uint64_t join_timeout;             /* ms to wait for shards that never joined; 0 = for ever */
    uint64_t stop_grace;               /* ms to serve after SIGTERM until the workers left; 0 = none */
    int join_timeout_action;           /* enum ps_join_action */
    uint64_t checkpoint_interval;      /* ms between checkpoints; 0 = only at shutdown */
    int checkpoint_keep;               /* checkpoints kept in state_dir */
    uint64_t max_frame;                /* largest accepted frame, bytes */
    uint64_t max_receive_memory;       /* all connections' receive buffers together, bytes */
    uint64_t max_table_memory;         /* all embedding tables' rows together, bytes */
    int table_admit;                   /* pushes of a key before its row is stored; 0, 1: the first */
    uint64_t table_expire;             /* rows not pushed in this many pushes to their table go; 0: never */
    uint64_t table_memory;             /* one table's bytes at most; 0: max_table_memory alone */
    int table_full;                    /* enum ps_table_full */
    int table_apply;                   /* enum ps_table_apply */
    int table_threads;                 /* table_apply = hogwild: apply threads; 0 = the CPUs, at most 8 */
    bool wire_bf16;                    /* offer bfloat16 tensors on the wire */
    char replica_of[PS_CONFIG_HOST_MAX + 8]; /* host:port of the leader this psd follows; "" = none */
    char advertise[PS_CONFIG_HOST_MAX + 8];  /* host:port workers reach this psd at; "" = listen's */
    int replication;                   /* enum ps_replication: when a push is acknowledged */
    uint64_t max_replica_lag;          /* ms a follower may go without fetching before it leaves the in-sync set */
    char coordinator[PS_CONFIG_PATH_MAX]; /* etcd members' URLs, commas between; "" = promotion by hand */
    char job[64];                      /* the job's name in the coordinator's keys */
    int part;                          /* this psd's part of the job (its key's N) */
    uint64_t lease_ttl;                /* ms, whole seconds: a leader's lease in etcd */
    uint64_t max_params;               /* largest model a hello may declare */
    uint64_t handshake_timeout;        /* ms a connection may take to say hello */
    int max_connections;               /* open connections at most */
    int max_handshakes;                /* of them, connections still in their handshake */
    uint64_t max_output_buffer;        /* unsent reply bytes before a connection is cut */
    uint64_t send_buffer;              /* SO_SNDBUF of each connection; 0 = the kernel's autotuning */
    uint64_t idle_timeout;             /* ms an admin connection may stay silent; 0 = off */
    int log_level;                     /* enum ps_log_level (common/log.h) */
    char web_root[PS_CONFIG_PATH_MAX]; /* the dashboard's files; "" = where installed */
    bool hogwild;                      /* Hogwild!: local workers step in psd's model segment */
    int hogwild_remote;                /* enum ps_hogwild_remote */
} ps_config;

typedef enum ps_config_type {
    PS_CT_BOOL,        /* bool: yes/no, true/false, on/off, 1/0 */
    PS_CT_INT,         /* int, lo..hi */
    PS_CT_U64,         /* uint64_t, lo..hi */
    PS_CT_DOUBLE,      /* double, finite, dmin..dmax */
    PS_CT_ENUM,        /* int: index of the word in words[] */
    PS_CT_STRING,      /* char[size], any text that fits */
    PS_CT_SIZE,        /* uint64_t bytes; "64M", "1G", "4096", lo..hi */
    PS_CT_DURATION,    /* uint64_t milliseconds; "500ms", "30s", "5m", lo..hi */
    PS_CT_HOSTPORT,    /* ps_hostport */
} ps_config_type;

struct psd;
struct ps_config_option;

/* A row's validate hook: parses text (trimmed) as option o's value, checks
 * its range, and stores it in field (o->size bytes of a ps_config). Returns
 * 0, or PS_EINVAL with a message naming the option in err, field then
 * untouched. A row without one uses its type's (ps_config_validator). */
typedef int (*ps_config_validate_fn)(const struct ps_config_option *o, const char *text, void *field, char *err,
                                     size_t errlen);

/* A row's apply hook: what psd does when the option changes while it runs
 * (a SIGHUP reload, `psctl set`). It is called after every changed value
 * is in s->cfg and after the one cross-check (srv_config_check) passed,
 * once per distinct hook however many of its options changed. Returns 0;
 * PS_CONFIG_TELL_POLICY when the consistency policy must be told (a layer
 * above the table's: the caller tells it, s->policy->reconfigured); or a
 * negative PS_E* code with a message in err: the caller then puts the old
 * settings back. A row without one (NULL) cannot change while psd
 * runs: a reload keeps its old value and says a restart is needed, `psctl
 * set` refuses it. */
typedef int (*ps_config_apply_fn)(struct psd *s, char *err, size_t errlen);
#define PS_CONFIG_TELL_POLICY 1

/* One row of the option table. */
typedef struct ps_config_option {
    const char *name;
    ps_config_type type;
    const char *def;               /* default, as it would be written in the file */
    size_t offset;                 /* offsetof(ps_config, field) */
    size_t size;                   /* sizeof the field */
    int64_t lo, hi;                /* bounds for INT, U64, SIZE, DURATION */
    double dmin, dmax;             /* bounds for DOUBLE */
    const char *const *words;      /* ENUM: the words, NULL-terminated */
    ps_config_validate_fn validate;/* parse and range; NULL: the type's */
    ps_config_apply_fn apply;      /* a change at run time; NULL: needs a restart */
    const char *help;              /* one paragraph */
} ps_config_option;

/* The hooks of the table that look beyond one value's syntax; settings.c
 * (psd's store layer) defines them. */
/* metrics_listen: empty, or host:port with an IPv4 or IPv6 literal. */
int srv_validate_metrics_listen(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen);
/* The optimizer's run-time settings (lr, momentum, weight_decay,
 * clip_norm, the schedule): the optimizer takes them again
 * (srv_optim_configure), so the schedule goes on from the model's version
 * with the new values. */
int srv_apply_optimizer(struct psd *s, char *err, size_t errlen);
/* dc_lambda, staleness_scale: the policy is to be told (DC-ASGD off drops
 * its base snapshots): returns PS_CONFIG_TELL_POLICY. */
int srv_apply_policy(struct psd *s, char *err, size_t errlen);
/* log_level: the logger's level. */
int srv_apply_log_level(struct psd *s, char *err, size_t errlen);
/* Options psd reads where it uses them (limits, timeouts, nonfinite):
 * nothing to redo; the next use sees the new value. */
int srv_apply_read_when_used(struct psd *s, char *err, size_t errlen);

/* The validate hook of a row: its own, or its type's. */
ps_config_validate_fn ps_config_validator(const ps_config_option *o);

/* 1 when option o may change while psd runs (it has an apply hook). */
int ps_config_reloadable(const ps_config_option *o);

/* The table, in the order psd --print-config shows it. *count gets the
 * number of rows. The array is static and never changes. */
const ps_config_option *ps_config_options(size_t *count);

/* The row called name ('-' may stand for '_'), or NULL. */
const ps_config_option *ps_config_find(const char *name);

/* Fill c with every option's default. Cannot fail (a default that does not
 * parse is a bug and aborts). */
void ps_config_defaults(ps_config *c);

/* Parse value for option key and store it in c. On error c is unchanged
 * and err says why, e.g. "workers: 0 is out of range 1..4096" or
 * "unknown key 'lrr' (did you mean 'lr'?)". Leading and trailing blanks
 * of value are ignored. Returns 0 or PS_EINVAL. */
int ps_config_set(ps_config *c, const char *key, const char *value, char *err,
                  size_t errlen);

/* Read an INI-style file and apply it on top of c. Keys may stand at the
 * top or under a [psd] section; '#' and ';' start comment lines. The whole
 * file is parsed into a copy of c which replaces c only if every line was
 * good: on error c is unchanged, and err names the file and line
 * ("conf/psd.conf:12: unknown key 'lrr'"). Returns 0, PS_EINVAL for bad
 * content (including a line longer than libinih's line buffer, about 200
 * bytes), PS_EIO when the file cannot be opened or read, or PS_ENOMEM. */
int ps_config_load(ps_config *c, const char *path, char *err, size_t errlen);

/* Write option o's value in c as text that ps_config_set accepts back, e.g.
 * "64M", "127.0.0.1:7000", "0.1". Returns the length (buf is cut to fit,
 * as with snprintf). */
int ps_config_format(const ps_config *c, const ps_config_option *o, char *buf,
                     size_t len);

/* Print every option as "name = value" lines, in table order. */
void ps_config_print(const ps_config *c, FILE *f);

/* True when option o differs between a and b. */
bool ps_config_differs(const ps_config *a, const ps_config *b, const ps_config_option *o);

/* "64M" -> 67108864. A non-negative integer with an optional unit K, M, G
 * or T (powers of 1024, any case, optionally followed by "B" or "iB").
 * Returns 0, or PS_EINVAL for garbage or a value that overflows. */
int ps_config_parse_size(const char *s, uint64_t *bytes);

/* "30s" -> 30000. A non-negative number (fraction allowed) with a unit ms,
 * s, m or h; a bare number means seconds. Result in whole milliseconds,
 * rounded to nearest. Returns 0 or PS_EINVAL. */
int ps_config_parse_duration(const char *s, uint64_t *ms);

#endif
