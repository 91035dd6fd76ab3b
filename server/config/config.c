/* config.c - the option table, one row per option, and finding a row by
 * name; config_value.c parses, validates, formats, sets and loads the
 * values the rows describe (config.h has both).
 *
 * To add an option: a field in struct ps_config, a row in options[] below,
 * and a commented-out entry with its default in conf/psd.conf. The row's
 * validate hook defaults to its type's; give it an apply hook (settings.c)
 * if it may change while psd runs, and put what it must agree with other
 * options in srv_settings_check (settings.c), or, when it depends on the
 * mode, in the mode's policy's check (policy/). Nothing else needs to know. */
#include "server/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/model/optim.h"

/* Where a row's value lands: offset and size of the field. */
#define AT(field) .offset = offsetof(ps_config, field), .size = sizeof(((ps_config *)0)->field)

static const char *const mode_words[] = {"asgd", "bsp", "ssp", NULL};
static const char *const schedule_words[] = {"constant", "step", "cosine", NULL};
static const char *const sum_order_words[] = {"shard", "arrival", NULL};
static const char *const log_level_words[] = {"debug", "info", "warn", "error", NULL};
static const char *const nonfinite_words[] = {"reject", "clip", NULL};
static const char *const join_action_words[] = {"continue", "stop", NULL};
static const char *const hogwild_remote_words[] = {"asgd", "refuse", NULL};
static const char *const table_full_words[] = {"refuse", "evict", NULL};
static const char *const table_apply_words[] = {"ordered", "hogwild", NULL};
static const char *const replication_words[] = {"sync", "async", NULL};

_Static_assert(PS_LOG_DEBUG == 0 && PS_LOG_INFO == 1 && PS_LOG_WARN == 2 && PS_LOG_ERROR == 3,
               "log_level_words must follow enum ps_log_level");

static const ps_config_option options[] = {
    {.name = "listen", .type = PS_CT_HOSTPORT, .def = "127.0.0.1:7000", AT(listen),
     .help = "TCP address psd listens on, as host:port: an IPv4 address, an IPv6 address "
             "in brackets ([::1]:7000) or a host name, resolved at start (its first IPv4 "
             "address, else its first IPv6 one; without token_file it must be a loopback "
             "address, as localhost is). Port 0 lets the kernel pick a free port; see "
             "port_file to learn which."},
    {.name = "mode", .type = PS_CT_ENUM, .def = "asgd", AT(mode), .words = mode_words,
     .help = "Consistency mode. asgd applies every push as it arrives and answers pulls "
             "with the newest parameters. bsp collects one push from each of the workers, "
             "applies their mean as one update and only then lets the next round start. "
             "ssp (stale synchronous parallel) applies pushes as they arrive but lets no "
             "worker run more than `staleness` clocks ahead of the slowest live one."},
    {.name = "workers", .type = PS_CT_INT, .def = "2", AT(workers), .lo = 1, .hi = 4096,
     .help = "Number of workers M in the job. In bsp mode a round closes when M pushes "
             "have arrived."},
    {.name = "state_dir", .type = PS_CT_STRING, .def = "", AT(state_dir),
     .help = "Directory for checkpoints and other state psd keeps across restarts. Empty "
             "means none: the model lives in memory only."},
    {.name = "init_from", .type = PS_CT_STRING, .def = "", AT(init_from),
     .help = "A safetensors file (as `psctl save` writes it: float32 tensors) psd takes its "
             "model from at start: the layout the workers' hellos must match and the values "
             "they pull instead of initialising (the optimizer's state starts fresh, the "
             "version at 0). A state_dir holding a checkpoint conflicts with it: psd refuses "
             "to start unless --fresh sets the checkpoints aside. Empty: none."},
    {.name = "port_file", .type = PS_CT_STRING, .def = "", AT(port_file),
     .help = "If set, psd writes the port it is bound to (a decimal number and a newline) "
             "to this file once it is listening. Scripts and tests use it with listen "
             "port 0."},
    {.name = "metrics_listen", .type = PS_CT_STRING, .def = "", AT(metrics_listen),
     .validate = srv_validate_metrics_listen,
     .help = "Address host:port (IP literals; port 0 picks a free one) where psd serves over "
             "HTTP its metrics for Prometheus (GET /metrics: the same text as `psctl "
             "metrics`) and its dashboard (GET /: a live page of the run; /api/job, "
             "/api/history: its JSON). Read-only; with token_file every request needs the "
             "token. Without token_file only a loopback address is allowed (protected mode, "
             "see allow_remote_without_token). Empty: no HTTP endpoint."},
    {.name = "token_file", .type = PS_CT_STRING, .def = "", AT(token_file),
     .help = "File holding the workers' shared secret: 16..1024 bytes (a trailing newline "
             "is ignored), in a file the group and others cannot read (chmod 600), or psd "
             "refuses to start. When set, every client must prove it knows the secret "
             "(HMAC-SHA256 challenge-response; the secret never crosses the wire) before psd "
             "accepts its hello; psworker and psctl read it with --token-file. Empty: no "
             "authentication."},
    {.name = "admin_token_file", .type = PS_CT_STRING, .def = "", AT(admin_token_file),
     .help = "File holding the admins' secret (psctl), with the same rules as token_file, "
             "which it needs. Empty: psctl may authenticate with the workers' secret, but "
             "then only reads (status, workers, metrics); commands that change psd and "
             "saving the model are refused."},
    {.name = "allow_remote_without_token", .type = PS_CT_BOOL, .def = "no",
     AT(allow_remote_without_token),
     .help = "Protected mode: without token_file psd refuses to listen on any address but "
             "loopback (127.0.0.0/8, ::1), since anyone who can reach it could read or "
             "change the model. yes lifts that, for a network you trust."},
    {.name = "optimizer", .type = PS_CT_ENUM, .def = "adagrad", AT(optimizer),
     .words = srv_optim_words,
     .help = "Optimizer psd applies to pushed gradients: sgd (with momentum, optionally "
             "Nesterov, and weight decay), adam, adamw (Adam with decoupled weight decay) "
             "or adagrad. Its state (momentum, moments) lives in psd. The default, adagrad at "
             "lr 0.02, trains every psworker model in every mode with up to 4 workers, "
             "however stale their gradients; set lr with the optimizer (adam about 0.001)."},
    {.name = "lr", .type = PS_CT_DOUBLE, .def = "0.02", AT(lr), .dmin = 0, .dmax = 1e3,
     .apply = srv_apply_optimizer,
     .help = "Learning rate: the step size of each update."},
    {.name = "momentum", .type = PS_CT_DOUBLE, .def = "0.9", AT(momentum), .dmin = 0,
     .dmax = 0.999999, .apply = srv_apply_optimizer,
     .help = "SGD momentum, 0 to just under 1. 0 turns momentum off."},
    {.name = "weight_decay", .type = PS_CT_DOUBLE, .def = "0", AT(weight_decay), .dmin = 0,
     .dmax = 1, .apply = srv_apply_optimizer,
     .help = "L2 weight decay: plain SGD updates w <- w - lr*(g + weight_decay*w). "
             "0 turns it off."},
    {.name = "nesterov", .type = PS_CT_BOOL, .def = "no", AT(nesterov),
     .help = "Use Nesterov momentum with sgd (needs momentum > 0)."},
    {.name = "beta1", .type = PS_CT_DOUBLE, .def = "0.9", AT(beta1), .dmin = 0, .dmax = 0.999999,
     .help = "Adam/AdamW: decay rate of the first moment (the mean of gradients)."},
    {.name = "beta2", .type = PS_CT_DOUBLE, .def = "0.999", AT(beta2), .dmin = 0, .dmax = 0.999999999,
     .help = "Adam/AdamW: decay rate of the second moment (the mean of squared gradients)."},
    {.name = "eps", .type = PS_CT_DOUBLE, .def = "1e-08", AT(eps), .dmin = 0, .dmax = 1,
     .help = "Adam, AdamW and AdaGrad: the term added to the denominator for stability."},
    {.name = "clip_norm", .type = PS_CT_DOUBLE, .def = "0", AT(clip_norm), .dmin = 0, .dmax = 1e9,
     .apply = srv_apply_optimizer,
     .help = "Clip each update's gradient to this L2 norm before the optimizer sees it. "
             "0 turns clipping off."},
    {.name = "nonfinite", .type = PS_CT_ENUM, .def = "reject", AT(nonfinite),
     .words = nonfinite_words, .apply = srv_apply_read_when_used,
     .help = "What psd does with a pushed gradient that holds NaN or infinity. reject "
             "refuses the push (error NONFINITE) and leaves the model untouched. clip "
             "sanitises it: NaN becomes 0, +-inf become +-FLT_MAX, and the push is then "
             "scaled down to the L2 norm clip_norm (which must be above 0); each such push "
             "is counted in psd_sanitized_pushes_total. Initial values are always rejected. "
             "The same holds for an update whose result would not be finite (finite "
             "pushes overflowing a parameter or the optimizer's state): reject refuses it "
             "(NONFINITE; a BSP round closes without its update), clip applies it with "
             "those results made finite the same way; counted in "
             "psd_nonfinite_updates_total and psd_clipped_updates_total."},
    {.name = "lr_schedule", .type = PS_CT_ENUM, .def = "constant", AT(lr_schedule),
     .words = schedule_words, .apply = srv_apply_optimizer,
     .help = "How the learning rate changes with the model version (updates applied, so "
             "it works the same in every mode): constant; step (multiply by lr_gamma every "
             "lr_step_size versions); cosine (from lr down to lr_min over "
             "lr_decay_versions). A linear warm-up (warmup_versions) may precede either."},
    {.name = "lr_step_size", .type = PS_CT_U64, .def = "1000", AT(lr_step_size), .lo = 1,
     .hi = INT64_MAX, .apply = srv_apply_optimizer,
     .help = "step schedule: versions between two decays."},
    {.name = "lr_gamma", .type = PS_CT_DOUBLE, .def = "0.1", AT(lr_gamma), .dmin = 0, .dmax = 1,
     .apply = srv_apply_optimizer,
     .help = "step schedule: factor applied to the learning rate at each decay."},
    {.name = "lr_decay_versions", .type = PS_CT_U64, .def = "10000", AT(lr_decay_versions), .lo = 1,
     .hi = INT64_MAX, .apply = srv_apply_optimizer,
     .help = "cosine schedule: versions (after warm-up) over which the rate falls from lr "
             "to lr_min; it stays at lr_min after."},
    {.name = "lr_min", .type = PS_CT_DOUBLE, .def = "0", AT(lr_min), .dmin = 0, .dmax = 1e3,
     .apply = srv_apply_optimizer,
     .help = "cosine schedule: the lowest learning rate."},
    {.name = "warmup_versions", .type = PS_CT_U64, .def = "100", AT(warmup_versions), .lo = 0,
     .hi = INT64_MAX, .apply = srv_apply_optimizer,
     .help = "Raise the learning rate linearly from lr/warmup_versions to lr over the first "
             "warmup_versions versions. 0 turns warm-up off. The default keeps the first "
             "steps small while several workers' gradients are computed on the same initial "
             "model (without it, adagrad's first steps of lr per value could leave the cnn "
             "at chance)."},
    {.name = "bsp_sum_order", .type = PS_CT_ENUM, .def = "shard", AT(bsp_sum_order),
     .words = sum_order_words,
     .help = "How a bsp round sums its pushes. shard adds them in shard order, so a run "
             "gives bit-for-bit the same model whatever order pushes arrive in; it keeps "
             "every push of the round until the round closes. arrival adds each push to "
             "one accumulator when its last chunk is in: less memory, but float rounding "
             "then depends on arrival order."},
    {.name = "backup_workers", .type = PS_CT_INT, .def = "0", AT(backup_workers), .lo = 0,
     .hi = 4095,
     .help = "bsp: close a round after the first M - backup_workers pushes (Chen et al., "
             "2016); pushes that arrive for a round already closed are dropped and "
             "counted. Must be less than workers."},
    {.name = "bsp_piece", .type = PS_CT_U64, .def = "0", AT(bsp_piece), .lo = 0, .hi = INT64_MAX,
     .apply = srv_apply_read_when_used,
     .help = "bsp: close each round piece by piece, a piece being this many values ([0, n), "
             "[n, 2n), ...): a piece's mean is applied as soon as every worker's push covers "
             "it, and a pull of version r + 1 whose range lies in closed pieces is answered "
             "then, while the rest of the round still arrives, so replies and pushes share "
             "the links (BytePS's partitions). Taken only with bsp_sum_order = shard, "
             "backup_workers = 0, clip_norm = 0, no plan and no follower (a leader with "
             "followers refuses bsp_piece); 0: the whole model at once."},
    {.name = "staleness", .type = PS_CT_INT, .def = "3", AT(staleness), .lo = 0, .hi = 1000000,
     .help = "ssp: how many clocks (pushes) a worker may run ahead of the slowest live "
             "worker before its pulls wait."},
    {.name = "staleness_scale", .type = PS_CT_BOOL, .def = "no", AT(staleness_scale),
     .apply = srv_apply_policy,
     .help = "asgd: divide a push's step by 1 + its staleness (model versions between the "
             "version it was computed on and now)."},
    {.name = "dc_lambda", .type = PS_CT_DOUBLE, .def = "0", AT(dc_lambda), .dmin = 0, .dmax = 100,
     .apply = srv_apply_policy,
     .help = "asgd: delay compensation of DC-ASGD (Zheng et al., 2017): a stale gradient g "
             "becomes g + dc_lambda * g * g * (w_now - w_base). 0 turns it off. Costs one "
             "model-sized copy per worker."},
    {.name = "local_steps", .type = PS_CT_INT, .def = "0", AT(local_steps), .lo = 0, .hi = 10000,
     .help = "bsp: local SGD (model averaging). Each worker takes this many steps with its "
             "own optimizer on its own copy of the model, then pushes the difference between "
             "the model it pulled and its own as a round's push; psd applies the round's "
             "mean difference as is (the mean of the workers' models), without its "
             "optimizer: lr, its schedule, warmup, weight_decay and clip_norm do not apply. "
             "Needs mode = bsp and optimizer = sgd with momentum = 0. 0 turns it off."},
    {.name = "elastic_alpha", .type = PS_CT_DOUBLE, .def = "0", AT(elastic_alpha), .dmin = 0,
     .dmax = 0.999999,
     .help = "asgd: elastic averaging SGD (Zhang et al., 2015), psd's model being the centre. "
             "Every elastic_tau local steps a worker pulls the centre c, moves its own model "
             "w by e = elastic_alpha * (w - c) towards it and pushes -e; psd adds e to the "
             "centre as is, without its optimizer (as local_steps). Needs mode = asgd and "
             "optimizer = sgd with momentum = 0. 0 turns it off; else above 0 and below 1."},
    {.name = "elastic_tau", .type = PS_CT_INT, .def = "1", AT(elastic_tau), .lo = 1, .hi = 10000,
     .help = "asgd with elastic_alpha: a worker's local steps between two exchanges with "
             "the centre."},
    {.name = "hogwild", .type = PS_CT_BOOL, .def = "no", AT(hogwild),
     .help = "Hogwild! (Recht et al., 2011): psd keeps the model in a memory segment that the "
             "workers on its machine map and update themselves, each applying its plain SGD "
             "steps (w -= lr * g, psd's lr) straight into it without locks; psd reads the "
             "segment's step counter as the version, and checkpoints, reports and serves it "
             "as ever. Needs mode = asgd and optimizer = sgd without momentum, weight decay, "
             "clipping, schedule or warm-up, and a model of at most 2^20 values; not with "
             "local_steps or elastic_alpha."},
    {.name = "hogwild_remote", .type = PS_CT_ENUM, .def = "asgd", AT(hogwild_remote),
     .words = hogwild_remote_words,
     .help = "hogwild: what becomes of a worker that cannot map the segment (another "
             "machine, or shm off). asgd: it pushes and pulls over TCP as in asgd, its "
             "pushes applied into the segment; refuse: its hello is refused (FORBIDDEN)."},
    {.name = "heartbeat_timeout", .type = PS_CT_DURATION, .def = "10s", AT(heartbeat_timeout),
     .lo = 100, .hi = INT64_C(86400000),
     .help = "A worker silent this long (no message, no heartbeat) is declared dead: it is "
             "logged, its connection closed, and bsp rounds go on without it. Counted in psd's "
             "running time: a stall of psd's own (its loop held, a SIGSTOP) does not count."},
    {.name = "stop_grace", .type = PS_CT_DURATION, .def = "0s", AT(stop_grace), .lo = 0,
     .hi = INT64_C(3600000), .apply = srv_apply_read_when_used,
     .help = "On SIGTERM or SIGINT with workers connected, psd writes a checkpoint (when "
             "between rounds) and goes on serving for up to this long, so that workers "
             "stopped by the same signal (a Slurm job's steps, a pod's containers) finish "
             "their step and leave; it stops when the last one has left or the time is up. "
             "A second signal stops it at once. 0: stop at once."},
    {.name = "join_timeout", .type = PS_CT_DURATION, .def = "2m", AT(join_timeout), .lo = 0,
     .hi = INT64_C(604800000), .apply = srv_apply_read_when_used,
     .help = "bsp and ssp: how long psd waits, from the first worker's join, for shards "
             "0..workers-1 that have not joined yet (their rounds and clocks wait for "
             "them). While it waits psd logs every 30 s which shards it waits for, and "
             "psctl status shows them; once this passes, join_timeout_action says what "
             "happens. 0: wait for ever (the log lines still repeat)."},
    {.name = "join_timeout_action", .type = PS_CT_ENUM, .def = "continue", AT(join_timeout_action),
     .words = join_action_words, .apply = srv_apply_read_when_used,
     .help = "What psd does when join_timeout passes with shards missing. continue goes on "
             "with the workers present: each missing shard is declared lost, as a worker "
             "that died, so rounds close without it and the workers share its data from "
             "their next epoch. stop ends the job: each connected worker gets an error "
             "(TIMEOUT) naming the missing shards and exits; psd stays up with the model."},
    {.name = "checkpoint_interval", .type = PS_CT_DURATION, .def = "30s", AT(checkpoint_interval),
     .lo = 0, .hi = INT64_C(604800000),
     .help = "Time between checkpoints written to state_dir (parameters, optimizer state, "
             "version, worker clocks). 0 writes one only at shutdown. Needs state_dir."},
    {.name = "checkpoint_keep", .type = PS_CT_INT, .def = "3", AT(checkpoint_keep), .lo = 1,
     .hi = 1000,
     .help = "Checkpoints kept in state_dir; older ones are deleted."},
    {.name = "max_frame", .type = PS_CT_SIZE, .def = "64M", AT(max_frame), .lo = 4096,
     .hi = INT64_C(2147483647),
     .help = "Largest frame psd accepts, in bytes (units K, M, G). A peer that announces "
             "a bigger frame is told so and disconnected. It must hold the largest push "
             "or pull reply, so raise it for big models."},
    {.name = "max_receive_memory", .type = PS_CT_SIZE, .def = "1G", AT(max_receive_memory),
     .lo = 65536, .hi = INT64_C(1099511627776),
     .help = "Most bytes of what peers sent that psd may hold at once (units K, M, G): the "
             "receive buffers of all connections and the keys of the table pulls waiting "
             "for a model version (parked), together. A frame is read whole into its "
             "connection's buffer, so a client announcing a big frame and sending all but "
             "its last byte pins that much; a connection whose frame would take the total "
             "past this limit gets the error LIMIT and is closed (a worker reconnects). The "
             "waiting pulls' keys may take half of it: a table pull that would have to wait "
             "past that is refused with LIMIT (that pull alone; the connection stays). It "
             "should hold max_frame for each worker sending big frames at once."},
    {.name = "max_table_memory", .type = PS_CT_SIZE, .def = "4G", AT(max_table_memory), .lo = 65536,
     .hi = INT64_C(17592186044416), .apply = srv_apply_read_when_used,
     .help = "Most bytes the embedding tables' rows, their optimizer state and their hash "
             "slots may take together (units K, M, G). A push whose new rows would pass it "
             "is refused with LIMIT, naming the table, and changes nothing; rows already "
             "stored keep being pulled and pushed. Lowering it keeps the rows there are. "
             "With table_full = evict such a push makes room instead."},
    {.name = "table_admit", .type = PS_CT_INT, .def = "0", AT(table_admit), .lo = 0, .hi = 255,
     .apply = srv_apply_read_when_used,
     .help = "Admission by frequency: a key of an embedding table gets a stored row only at "
             "its Nth push; before, pulls answer its initial row and pushes are counted but "
             "not stored. Counted per table in a count-min sketch of 4 x 262,144 8-bit "
             "counters (1 MiB, in the table's memory) whose counts halve every 262,144 "
             "counted pushes (N pushes must come within about that many), which can admit "
             "a key early when keys collide. 0 or 1: every pushed key is stored."},
    {.name = "table_expire", .type = PS_CT_U64, .def = "0", AT(table_expire), .lo = 0,
     .hi = INT64_C(1099511627776), .apply = srv_apply_read_when_used,
     .help = "Expiry: a row of an embedding table not pushed in this many pushes to its "
             "table (a TPUSH applied in asgd and ssp, a round's update in bsp) is dropped; a "
             "later pull answers its initial row. Each push looks at max(1024, 4 x its keys) "
             "rows, so a stale row goes within rows / that many pushes. 0: rows never expire."},
    {.name = "table_memory", .type = PS_CT_SIZE, .def = "0", AT(table_memory), .lo = 0,
     .hi = INT64_C(17592186044416), .apply = srv_apply_read_when_used,
     .help = "Most bytes one embedding table may take (units K, M, G), beside "
             "max_table_memory for all of them; table_full says what a push past it meets. "
             "A table's first row takes its first block of rows and hash slots (some "
             "hundreds of KB): a table_memory below that is refused when the table is "
             "declared. 0: no cap per table."},
    {.name = "table_full", .type = PS_CT_ENUM, .def = "refuse", AT(table_full), .words = table_full_words,
     .apply = srv_apply_read_when_used,
     .help = "What a push whose new rows would take its table past table_memory, or the "
             "tables past max_table_memory, meets. refuse: LIMIT, nothing changed. evict: "
             "the table's least recently pushed rows (each the oldest of 8 drawn at random, "
             "none of the push's own) are dropped until the new rows fit; a later pull "
             "answers a dropped row's initial values."},
    {.name = "replica_of", .type = PS_CT_STRING, .def = "", AT(replica_of),
     .help = "host:port of the leader psd of this part: this psd follows it, a replica "
             "(PROTOCOL.md 17). It takes a snapshot of the leader's model and tables, then "
             "applies every change the leader makes, in the leader's order; it answers "
             "pulls (a read replica) and refuses workers' pushes with NOT_LEADER until `psctl "
             "promote` makes it the leader. Give it the leader's settings (optimizer, "
             "tables' bounds). Empty: this psd leads (or stands alone)."},
    {.name = "advertise", .type = PS_CT_STRING, .def = "", AT(advertise),
     .help = "host:port at which workers reach this psd, as its leader lists it among the "
             "part's replicas. Empty: the address it listens on."},
    {.name = "replication", .type = PS_CT_ENUM, .def = "sync", AT(replication), .words = replication_words,
     .help = "When a leader with followers acknowledges a push. sync: once every in-sync "
             "follower holds it (a follower that dies or stalls leaves the in-sync set after "
             "max_replica_lag, and pushes go on without it). async: at once; the followers "
             "trail by what they have not fetched yet."},
    {.name = "max_replica_lag", .type = PS_CT_DURATION, .def = "2s", AT(max_replica_lag), .lo = 10,
     .hi = INT64_C(3600000),
     .help = "A follower that has fetched nothing for this long while the leader has changes "
             "for it leaves the in-sync set (logged, counted, shown in psctl status): sync "
             "replies stop waiting for it. It joins again once it has caught up."},
    {.name = "coordinator", .type = PS_CT_STRING, .def = "", AT(coordinator),
     .help = "etcd members (v3 API, through its JSON gateway) that elect the leader of each "
             "part, as URLs with commas between: http://10.0.0.1:2379,http://10.0.0.2:2379,"
             "http://10.0.0.3:2379. The leader holds a lease on the key "
             "/psd/JOB/part/N/leader and renews it; when it lapses, an in-sync follower "
             "takes the key and leads, with no `psctl promote`; a leader that could not "
             "renew it stops acknowledging pushes at 2/3 of lease_ttl unless every "
             "follower holds them (docs/fault-tolerance.md). Needs job. Empty: no "
             "coordinator, followers are promoted by hand."},
    {.name = "job", .type = PS_CT_STRING, .def = "", AT(job),
     .help = "The job's name in the coordinator's keys (/psd/JOB/part/N/leader): letters, "
             "digits, '-', '_' and '.'. Every psd of one job gives the same; a psd whose settings "
             "differ from the job's record (/psd/JOB/job) while that job runs stops at start."},
    {.name = "part", .type = PS_CT_INT, .def = "0", AT(part), .lo = 0, .hi = 65535,
     .help = "This psd's part of the job, N in the coordinator's key: a leader and its "
             "followers give the same, each part of a model split over several psd its own."},
    {.name = "lease_ttl", .type = PS_CT_DURATION, .def = "5s", AT(lease_ttl), .lo = 2000,
     .hi = INT64_C(600000),
     .help = "A leader's lease in the coordinator, in whole seconds: it renews it every "
             "third of it, stops acknowledging pushes on its lease alone 2/3 of it after the "
             "last renewal etcd answered, and a follower takes over about lease_ttl after the "
             "leader died."},
    {.name = "table_apply", .type = PS_CT_ENUM, .def = "ordered", AT(table_apply), .words = table_apply_words,
     .help = "How psd applies the rows of table pushes (TPUSH, TPUSHPULL) in asgd and ssp. "
             "ordered: on its loop, one push after the other, each whole. hogwild: psd "
             "finds or creates a push's rows on its loop and hands the arithmetic to "
             "table_threads apply threads, which step the rows of different pushes at once "
             "without locks (Hogwild!, Recht et al., 2011): a worker's pushes still apply "
             "in order, but a row two workers push at once may lose one of the two steps, "
             "and a pull may see a row another worker's push is half-way through. Not with "
             "mode = bsp, whose rounds sum table pushes in shard order, bit for bit. Read at "
             "start."},
    {.name = "table_threads", .type = PS_CT_INT, .def = "0", AT(table_threads), .lo = 0,
     .hi = PS_TABLE_THREADS_MAX,
     .help = "table_apply = hogwild: the apply threads psd starts. 0: as many as the machine "
             "has CPUs, at most 8. Read at start."},
    {.name = "wire_bf16", .type = PS_CT_BOOL, .def = "yes", AT(wire_bf16),
     .help = "Offer bfloat16 tensors on the wire: a client that asks for them (psworker "
             "--wire bf16) then pushes gradients and receives parameters at 2 bytes a value "
             "instead of 4, rounded to nearest even; psd converts them to float32 on "
             "arrival and keeps the model, its optimizer state and its checkpoints in "
             "float32. no: psd offers float32 only and refuses bfloat16 data."},
    {.name = "max_params", .type = PS_CT_U64, .def = "1073741824", AT(max_params), .lo = 1,
     .hi = INT64_C(17179869184),
     .help = "Largest model, in parameters (float32 each), that a worker's hello may declare. "
             "The first worker's hello proposes the layout; psd allocates the model and the "
             "optimizer state only when that worker sends its initial values (INIT), and "
             "forgets the layout if every worker leaves before, so a hello alone costs "
             "nothing. The default, 2^30, is 4 GiB of parameters: with Adam's two moments "
             "12 GiB, which leaves a 24 GiB machine room for a BSP round's kept pushes of "
             "two workers."},
    {.name = "handshake_timeout", .type = PS_CT_DURATION, .def = "10s", AT(handshake_timeout),
     .lo = 100, .hi = INT64_C(3600000), .apply = srv_apply_read_when_used,
     .help = "A connection that has not said hello (and, when psd requires a token, answered "
             "its challenge) this long after connecting is closed, so idle or stray "
             "connections cannot hold connection slots. Counted in psd's running time, as "
             "`heartbeat_timeout`: a stall of psd's own does not count."},
    {.name = "max_connections", .type = PS_CT_INT, .def = "1024", AT(max_connections),
     .lo = 1, .hi = 65536, .apply = srv_apply_read_when_used,
     .help = "Most connections open at once (workers and admin tools together). Further "
             "connections are refused with an error."},
    {.name = "max_handshakes", .type = PS_CT_INT, .def = "64", AT(max_handshakes), .lo = 1, .hi = 65536,
     .apply = srv_apply_read_when_used,
     .help = "Most connections at once that have not finished their handshake (hello, and "
             "the token's challenge). A new connection past it is let in and the oldest "
             "unfinished one closed (error LIMIT), so clients that connect and say nothing "
             "hold few slots, cannot keep a worker from connecting, and a worker that "
             "completes its hello at once is never the one closed."},
    {.name = "max_output_buffer", .type = PS_CT_SIZE, .def = "256M", AT(max_output_buffer),
     .lo = 65536, .hi = INT64_C(1099511627776), .apply = srv_apply_read_when_used,
     .help = "Most bytes of replies psd keeps queued for one connection that does not read "
             "them. A client past it (it sends requests but stopped reading) is disconnected, "
             "logged and counted in psd_disconnects_total{reason=\"output_buffer\"}. One "
             "reply larger than the limit is still sent when nothing else is queued."},
    {.name = "send_buffer", .type = PS_CT_SIZE, .def = "0", AT(send_buffer), .lo = 0,
     .hi = INT64_C(268435456), .apply = srv_apply_read_when_used,
     .help = "The kernel's send buffer of each connection (SO_SNDBUF; units K, M; the kernel "
             "doubles it for its bookkeeping). 0: "
             "the kernel sizes it (its autotuning, up to net.ipv4.tcp_wmem's maximum). On "
             "links whose queues are short (a switch's shallow buffers, a shaped link), a "
             "psd answering several workers at once can overflow them and lose packets; a "
             "cap such as 64K bounds what each reply puts in flight (bench/README.md, "
             "multihost.py, measures it). New connections take a reloaded value."},
    {.name = "idle_timeout", .type = PS_CT_DURATION, .def = "5m", AT(idle_timeout), .lo = 0,
     .hi = INT64_C(604800000), .apply = srv_apply_read_when_used,
     .help = "An admin connection (psctl) that sends nothing this long is closed, except while "
             "psd owes it a reply (a waiting pull or checkpoint). 0: never. Workers are "
             "governed by heartbeat_timeout instead."},
    {.name = "log_level", .type = PS_CT_ENUM, .def = "info", AT(log_level),
     .words = log_level_words, .apply = srv_apply_log_level,
     .help = "Least important log records written to stderr: debug, info, warn or error."},
    {.name = "web_root", .type = PS_CT_STRING, .def = "", AT(web_root),
     .help = "Directory holding the dashboard's page (index.html, app.js, style.css) and "
             "uPlot (uplot/), which psd serves on metrics_listen. Empty: ../share/psd/web "
             "from the directory of the psd program, where `cmake --install` puts them "
             "(PREFIX/share/psd/web) and the build copies them (build/share/psd/web)."},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

const ps_config_option *ps_config_options(size_t *count)
{
    if (count)
        *count = N_OPTIONS;
    return options;
}

/* Compare an option name with a key, '-' in the key standing for '_'. */
static bool name_matches(const char *name, const char *key)
{
    for (; *name && *key; name++, key++) {
        char k = *key == '-' ? '_' : *key;
        if (*name != k)
            return false;
    }
    return *name == '\0' && *key == '\0';
}

const ps_config_option *ps_config_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (name_matches(options[i].name, name))
            return &options[i];
    return NULL;
}
