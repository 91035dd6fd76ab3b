/* psd/client.h - libpsclient, the C client library of the psd parameter server.
 *
 * A worker declares its model's layout (named float32 tensors with shapes,
 * laid out in one flat vector), connects to psd (or to several psd that
 * share the model, one part each), and then pushes gradients and pulls
 * parameters: the whole model, named tensors or key ranges. Everything
 * else a worker needs lives here: the handshake and token authentication,
 * initial values (the first worker's win, the others pull them), chunking
 * of big tensors, pipelined chunk pulls, a shared-memory segment with a
 * psd on the same machine, float32 or bfloat16 on the wire, heartbeats,
 * and reconnecting with backoff when psd goes away.
 *
 * The reference, with a complete example, is docs/client.md.
 *
 * ERRORS. Every function that can fail returns 0 or a negative PSC_E* code;
 * psc_strerror(code) names the code, and psc_errmsg(c) tells what happened
 * on that client, for people, in one line. A failing call does no part of
 * its work twice and leaves the client usable unless it says otherwise.
 *
 * THREADS. A psc_client is used by one thread at a time (calls on one
 * client must not overlap); different clients are independent. The
 * library runs its own threads per client (a heartbeat thread per psd,
 * and one for psc_pushpull_start), which never call back into the caller.
 * psc_strerror, psc_version_string, and psc_waiting_for on a client in
 * use, may be called from any thread.
 *
 * BUFFERS. The parameters and gradients are two flat float32 vectors of
 * psc_size() values. By default the library owns both (psc_params(),
 * psc_grads()): they stay at the same address until psc_free, and with a
 * psd on the same machine they live in the shared segment psd reads and
 * writes, so pushes and pulls copy nothing. psc_bind() makes the library
 * read gradients from and write parameters into the caller's vectors
 * instead; the caller then keeps them alive, at that address, until the
 * next psc_bind or psc_free. Strings returned by the library belong to it
 * and stay valid until the next call on the same client (psc_errmsg) or
 * psc_free (names, mode). Nothing the library returns is freed by the
 * caller except the client itself (psc_free). */
#ifndef PSD_CLIENT_H
#define PSD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(PSC_STATIC)
#define PSC_API __attribute__((visibility("default")))
#else
#define PSC_API
#endif

#define PSC_VERSION_MAJOR 1
#define PSC_VERSION_MINOR 10
#define PSC_VERSION_PATCH 0

/* Error codes. -1 .. -24 are the protocol's own codes (proto/PROTOCOL.md
 * section 10): psd answers a request with them, and psc_errmsg() then
 * holds psd's message. The library adds -25 and below. */
enum {
    PSC_OK = 0,
    PSC_EMALFORMED = -1,   /* psd sent something undecodable */
    PSC_ETOO_BIG = -2,     /* a frame over the limit */
    PSC_EUNSUPPORTED = -3, /* protocol version or tensor type psd does not take */
    PSC_EBAD_TYPE = -4,
    PSC_EBAD_FIELD = -5,
    PSC_ESTATE = -6,       /* not allowed now: not connected, closed, layout already fixed */
    PSC_ELAYOUT = -7,      /* psd holds another model layout */
    PSC_ERANGE = -8,       /* key range outside the model */
    PSC_ENONFINITE = -9,   /* gradient holds NaN or infinity (psd refused it) */
    PSC_ESTALE = -10,
    PSC_EDUPLICATE = -11,  /* second push in one BSP round */
    PSC_ESHARD = -12,      /* shard taken or out of range */
    PSC_ENOT_READY = -13,
    PSC_EAUTH = -14,       /* token missing, wrong, or psd could not prove it */
    PSC_EFORBIDDEN = -15,
    PSC_ELIMIT = -16,      /* psd's connection limit (retried while connecting) */
    PSC_ESHUTDOWN = -17,
    PSC_ENOMEM = -18,
    PSC_EIO = -19,
    PSC_ECONNECT = -20,    /* psd unreachable (after the connect wait) */
    PSC_ETIMEOUT = -21,    /* no reply in time, or reconnecting gave up */
    PSC_ECLOSED = -22,     /* psd closed the connection */
    PSC_EINVAL = -23,      /* a bad argument; psc_errmsg says which */
    PSC_EREMOTE = -24,     /* psd refused with a code not listed above */
    PSC_EBUSY = -25,       /* a psc_pushpull_start is in flight: psc_wait first */
    PSC_ENOTFOUND = -26,   /* no tensor of that name */
    PSC_EINTR = -27        /* a signal ended the wait (option interrupt on) */
};

typedef struct psc_client psc_client;

/* "1.0.0" */
PSC_API const char *psc_version_string(void);

/* A short description of code (negative or positive): never NULL. */
PSC_API const char *psc_strerror(int code);

/* ---- creating and configuring ------------------------------------------- */

/* A new client, not connected, with the defaults: server $PSD_SERVER or
 * 127.0.0.1:7000, token file $PSD_TOKEN_FILE, shard 0/1, timeout 600 s,
 * reconnect 60 s, connect wait 30 s, f32, shared memory on, automatic
 * reconnects on. NULL only when out of memory. Free it with psc_free. */
PSC_API psc_client *psc_new(void);

/* Sets one option (both strings are copied). Keys and values:
 *   server       "host:port", or "host:port,host:port,...": a model split
 *                over that many psd, part i on the i-th (every worker lists
 *                them in the same order); a part as "host:port/host:port/...":
 *                its replicas, the client going on with the next when one is
 *                lost or follows a leader, its unanswered pushes sent again
 *                and applied once (docs/client.md, "Replicas")
 *   shard        "K/M" (0 <= K < M), or "auto": K and M from the launcher's
 *                environment: OMPI_COMM_WORLD_RANK/_SIZE (mpirun),
 *                SLURM_PROCID/SLURM_NTASKS (srun), RANK/WORLD_SIZE
 *                (torchrun), JOB_COMPLETION_INDEX/PSD_WORKERS (Kubernetes)
 *   token_file   the secret to prove to psd (mode 600); "" for none
 *   timeout_ms   how long to wait for one reply (1 .. 86400000)
 *   reconnect_s  when psd goes away, keep reconnecting this long (0 .. 86400)
 *   connect_s    at psc_connect, wait this long for psd to come up (0 .. 86400)
 *   wire         "f32", or "bf16": 2 bytes a value on the wire when psd
 *                offers it (else f32, with a warning)
 *   skip_zeros   "on" (the default) or "off": float32 pushes leave their
 *                +0.0 values out (a bitmap marks the rest) when psd offers
 *                it and that saves a sixteenth of the bytes or more; psd
 *                gets the same values bit for bit (1.6)
 *   compress     "auto" (the default), "on" or "off": float32 pushes go as
 *                one zstd frame (level 1) when psd offers it and that saves
 *                a sixteenth of the bytes or more, and the parameters come
 *                back so on the same terms; the same values bit for bit;
 *                auto: with a psd on another machine (1.6)
 *   topk         "0" (the default: off) or a ratio 0.00001 .. 1: top-k with
 *                error feedback: a push sends, of each tensor, only that
 *                ratio of its values, the largest of gradient plus residual,
 *                and keeps the rest in a residual the next push adds in
 *                (nothing is lost; a step that did not count gives its
 *                values back). After a push the gradient vector holds what
 *                was sent. psc_connect refuses it with wire "bf16" or
 *                skip_zeros "off" (1.7)
 *   shm          "on" or "off": offer psd a shared-memory segment
 *   reconnect    "on" or "off": push and pull reconnect by themselves
 *   chunk        floats a frame of a chunked push or pull (1024 .. 2^24,
 *                default 2^20); a part of the model up to this size goes
 *                as one PUSHPULL. psd refuses frames over its max_frame
 *   pull_window  chunk pulls in flight (0 .. 64, default 2); 0: every
 *                chunk request, push or pull, waits for its reply
 *   send_buffer  each connection's kernel send buffer in bytes (SO_SNDBUF;
 *                0, the default: the kernel sizes it, or 4096 .. 2^28), for
 *                links whose short queues a step's flows overflow (1.3.1)
 *   barrier      "auto" (the default), "on" or "off": a BSP step over a
 *                split model ends at a BARRIER on part 0's psd, so that
 *                every worker starts its next round when the last has its
 *                replies; auto: when a part's psd is on another machine (1.4)
 *   pieces       "auto" (the default), "on" or "off": a BSP step sends a
 *                part whose psd closes rounds in pieces (its WELCOME says
 *                "piece") as each piece's PUSH and PULL, and reads every
 *                part's answers as they come, so a piece's values travel
 *                while the next pieces are pushed; auto: when that psd is
 *                on another machine (1.5)
 *   report_s     seconds between psc_progress's reports to psd (default 1,
 *                or $PSD_REPORT_INTERVAL; 0: none); may change at any time
 *   log          "debug", "info", "warn" or "error": the library's log
 *                lines on stderr (process-wide)
 *   spin_us      microseconds (0, the default, .. 10^6) each wait for a
 *                reply polls the connection, yielding the CPU between
 *                polls, before it sleeps, so that psd's reply need not wake
 *                a sleeping thread: for workers on psd's machine with cores
 *                psd does not use (1.10)
 *   interrupt    "on" or "off" (the default): with on, a signal whose
 *                handler runs on the calling thread while a call waits
 *                for psd (a BSP round, a pull, psc_connect's retries) ends
 *                that call with PSC_EINTR; the library's own threads block
 *                signals, so SIGINT and SIGTERM reach the caller's. Then
 *                psc_leave (it says bye at once) or try the call again (the
 *                library reconnects first: a wait ended mid-frame leaves
 *                the connection unusable); psc_wait is not interrupted
 *   wakeup_fd    "off" (the default) or a descriptor open for reading and
 *                non-blocking that a signal makes readable (a self-pipe
 *                the handler writes to; Python's signal.set_wakeup_fd):
 *                with interrupt on, every wait watches it beside its
 *                connection, so a signal that lands just before the wait
 *                sleeps, or on another thread, still ends the call with
 *                PSC_EINTR. Each call empties it when it begins (1.12)
 *   reader       "on" or "off" (the default): with on, the hello says
 *                "reader": a follower of a part (a read replica) answers
 *                the pulls and table pulls, each saying how far behind its
 *                leader it is (psc_lag); pushes are refused (NOT_LEADER on a
 *                follower, FORBIDDEN on a leader); no shard is taken (1.12)
 * Before psc_connect only, except "log" and "report_s". Returns 0, PSC_EINVAL (an unknown
 * key or a bad value, said in psc_errmsg) or PSC_ESTATE. */
PSC_API int psc_set(psc_client *c, const char *key, const char *value);

/* One option of psc_set, as the library's one table of options holds it;
 * programs built on the library take their settings from it (the Python
 * package's keyword arguments, psworker's flags and their help). Fields may
 * be added at the end. */
typedef struct psc_option_info {
    const char *name;   /* the key of psc_set (and the Python keyword) */
    const char *flag;   /* the command-line flag of programs on the library
                         * (psworker), without "--"; NULL: none has one */
    const char *arg;    /* the value's form in a usage line: "MS", "auto|on|off" */
    const char *values; /* what a value may be, as psc_set's error says it */
    const char *dflt;   /* the default, in words */
    const char *help;   /* what the option does, one sentence or a few */
} psc_option_info;

/* The i-th option (0, 1, ...), or NULL past the last (1.7). The strings are
 * static; nothing is to be freed. */
PSC_API const psc_option_info *psc_option(unsigned i);

/* Appends a tensor to the layout: name (1..127 printable bytes), ndim
 * (1..6) dims each >= 1; at most 2048 tensors (proto/PROTOCOL.md, Limits). Tensors follow each other in the flat vector in
 * the order they are added. Every worker of a job declares the same
 * tensors in the same order (psd refuses another layout: PSC_ELAYOUT).
 * Only before the layout is fixed (the first psc_params, psc_grads,
 * psc_bind or psc_connect): PSC_ESTATE after. */
PSC_API int psc_add_tensor(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims);

/* Appends a buffer: a tensor of the model that psd keeps (pulls bring it,
 * checkpoints and `psctl save` hold it) but does not train, such as
 * BatchNorm's running statistics. In a push, a buffer's place in the
 * gradient vector holds the worker's current values of it (not a
 * gradient), and psd combines them by rule: "mean" (a BSP round: the mean
 * of the round's values; asgd and ssp: each push moves psd's values
 * 1/workers of the way to its own) or "first" (shard 0's values; in a BSP
 * round, the lowest shard's when psd keeps the pushes in shard order,
 * its default, else the mean). dtype, NULL for "F32", is the dtype
 * `psctl save` writes it as: "F32", "F64", "I64" (a counter such as
 * num_batches_tracked) or "I32"; values travel as float32 (integers exact
 * to 2^24). Otherwise as psc_add_tensor; the rule and dtype are part of
 * the layout every worker declares alike. */
PSC_API int psc_add_buffer(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims, const char *rule,
                           const char *dtype);

/* Values in the flat vector (0 before any tensor). */
PSC_API uint64_t psc_size(const psc_client *c);
/* Tensors declared. */
PSC_API uint32_t psc_tensor_count(const psc_client *c);
/* Tensor i's name, rank, dims (up to 6 written to dims, may be NULL),
 * offset and count; NULL name pointer-out arguments are skipped. Returns 0
 * or PSC_ERANGE. */
PSC_API int psc_tensor_info(const psc_client *c, uint32_t i, const char **name, uint32_t *ndim, uint64_t *dims,
                            uint64_t *offset, uint64_t *count);
/* The offset and count of the tensor called name: 0 or PSC_ENOTFOUND. */
PSC_API int psc_tensor_find(const psc_client *c, const char *name, uint64_t *offset, uint64_t *count);

/* ---- buffers ------------------------------------------------------------- */

/* The library's parameter and gradient vectors (psc_size() floats each,
 * 64-byte aligned, zero at first), fixing the layout. NULL when the layout
 * is empty or cannot be fixed (psc_errmsg says why). They keep their
 * address until psc_free. */
PSC_API float *psc_params(psc_client *c);
PSC_API float *psc_grads(psc_client *c);

/* Makes pulls write into params and pushes read from grads (each
 * psc_size() floats, float-aligned, owned by the caller), or the library's
 * own vectors again for NULL. With the caller's vectors a shared segment
 * costs one copy each way. Not while a psc_pushpull_start is in flight
 * (PSC_EBUSY). */
PSC_API int psc_bind(psc_client *c, float *params, float *grads);

/* ---- connecting ---------------------------------------------------------- */

/* Connects to every psd (waiting for one that is not up yet, and retrying
 * one that is at its connection limit, with backoff, for up to connect_s),
 * proves the token, and gets the model: when psd holds no values yet this
 * worker's parameter vector, as it is now, becomes the initial model (so
 * write your initial values there first); otherwise the vector is
 * overwritten with psd's. Every psd must run the same mode. Returns 0 or a
 * code. */
PSC_API int psc_connect(psc_client *c);

/* Says goodbye to every psd and closes (waiting for a step in flight). The
 * client cannot connect again; psc_free it. Safe to call twice. */
PSC_API void psc_close(psc_client *c);

/* With the option interrupt on: ends the call waiting for psd now, if one
 * is (it returns PSC_EINTR), and every wait of a later call at once, until
 * psc_leave or psc_close, which still say bye. Async-signal-safe: for a
 * stop signal's handler, so that a signal that lands just before a call
 * begins to wait (where it would not end the wait) still stops the worker.
 * 0, or PSC_EINVAL for NULL. (1.12) */
PSC_API int psc_interrupt(psc_client *c);

/* psc_close with the reason psd shows for this worker ("left: REASON" in
 * its log and psctl status), such as "stopped by SIGTERM". reason may be
 * NULL or "" (then the same as psc_close); at most 200 bytes are sent. */
PSC_API void psc_leave(psc_client *c, const char *reason);

/* Closes if needed and frees everything; NULL-safe. The library's vectors
 * are gone afterwards. */
PSC_API void psc_free(psc_client *c);

/* ---- push and pull ------------------------------------------------------- */
/* Each of these blocks until psd answered. When the connection is lost
 * (psd killed, restarted, unreachable) and the "reconnect" option is on,
 * the call reconnects with exponential backoff and jitter (100 ms doubling
 * to 5 s) for up to reconnect_s, gets the model anew, and returns 0: the
 * gradient of that step is lost (counted in psc_lost_steps) and the
 * parameter vector holds psd's values. A psd restarted without its state
 * gets this worker's parameters as its initial values. */

/* Pushes the whole gradient vector and pulls the whole model into the
 * parameter vector (bsp: at the version after this round closes). One
 * round trip per psd for models of up to 2^20 values a psd, chunked above. */
PSC_API int psc_pushpull(psc_client *c);

/* Pushes the whole gradient vector (one step). */
PSC_API int psc_push(psc_client *c);

/* Pulls the whole model into the parameter vector: the newest values, or
 * in bsp after a psc_push the values after that round. */
PSC_API int psc_pull(psc_client *c);

/* The same for values [off, off + len) of the flat vector, or the tensor
 * called name. A range push is one step for every psd it touches (in bsp
 * a round wants one step from each worker: push the whole model there). */
PSC_API int psc_push_range(psc_client *c, uint64_t off, uint64_t len);
PSC_API int psc_pull_range(psc_client *c, uint64_t off, uint64_t len);
PSC_API int psc_push_tensor(psc_client *c, const char *name);
PSC_API int psc_pull_tensor(psc_client *c, const char *name);

/* Says the next push's (or pushpull's) gradient was computed on model
 * version `version` (one above psc_model_version() counts as that), for a caller that
 * computes on older parameters than the last pulled (a pipeline: see
 * docs/client.md). Without it a push carries the version of the
 * parameters last pulled. One psd only (ignored with several). */
PSC_API int psc_set_base(psc_client *c, uint64_t version);

/* psc_pushpull on the library's own thread: returns at once, so the
 * caller can compute meanwhile (on other memory: the gradient and
 * parameter vectors must be neither read nor written until psc_wait
 * returns). psc_wait blocks until it is done and returns its result;
 * psc_poll returns 1 when it is done (psc_wait will not block), 0 while
 * it runs. psc_wait without a step in flight returns 0. */
PSC_API int psc_pushpull_start(psc_client *c);
PSC_API int psc_wait(psc_client *c);
PSC_API int psc_poll(psc_client *c);

/* ---- the job ------------------------------------------------------------- */

/* Tells every psd this worker's progress (psctl status shows it): epoch,
 * mean training loss, test accuracy in [0, 1] and test loss (acc < 0: not
 * measured), samples trained so far and samples per second. */
PSC_API int psc_report(psc_client *c, uint32_t epoch, double loss, double acc, double test_loss, uint64_t samples,
                       double rate);

/* Tells the library of training done since the last call: n samples
 * whose losses sum to loss_sum, in the job's epoch `epoch` (epochs done,
 * from 0). Every report_s seconds it sends psd a report of the mean loss
 * over the samples since the previous one, the samples told of so far and
 * their rate, so psctl and psd's dashboard follow the training within an
 * epoch; call it after every step (nothing is sent when none is due). A
 * step started by psc_pushpull_start is waited for before a report goes
 * (its result is returned here then; the next psc_wait returns 0).
 * Returns 0 or a code (PSC_EINVAL for a loss sum that is not finite). */
PSC_API int psc_progress(psc_client *c, uint32_t epoch, double loss_sum, uint64_t n);

/* The job's live shards from psd: shards 0..M-1 less those psd declared
 * lost. *rank is this worker's index among them, *count how many. */
PSC_API int psc_live_shards(psc_client *c, uint32_t *rank, uint32_t *count);

/* ---- a BSP job's plan (docs/client.md, "A job by psd's plan") ------------- */

/* Declares the job's plan before psc_connect: `epochs` passes over a
 * training set of `samples` samples, `batch` of them (the global batch,
 * all workers together) in each BSP round, in an order every worker
 * derives from `seed` and the epoch. psd takes the first worker's plan
 * and from then on tells each worker, with every pull that opens a round,
 * which samples it trains (psc_plan_slice) and when the job is done
 * (psc_plan_done). 1 <= epochs <= 2^20, 1 <= samples <= 2^40,
 * 1 <= batch <= samples. Returns 0, PSC_EINVAL or PSC_ESTATE (connected). */
PSC_API int psc_plan_set(psc_client *c, uint64_t epochs, uint64_t samples, uint64_t batch, uint64_t seed);

/* 1 when the job runs by a plan (the first psd's WELCOME told it: BSP,
 * and some worker declared one), with it in the arguments that are not
 * NULL; 0 otherwise (count your own epochs and steps then). The job's plan
 * may differ from the one this worker declared: the first worker's wins. */
PSC_API int psc_plan(const psc_client *c, uint64_t *epochs, uint64_t *samples, uint64_t *batch, uint64_t *seed);

/* This worker's part of the round the last pull (psc_connect, psc_pull,
 * psc_pushpull) opened: positions [*lo, *hi) of epoch *epoch's order of
 * the training set (epochs from 0), as part *rank of *count. Returns 1
 * with them filled (NULL arguments skipped; hi may equal lo: nothing to
 * train, push a zero gradient), or 0 when psd said no part (no plan, or
 * the plan is done). */
PSC_API int psc_plan_slice(const psc_client *c, uint64_t *epoch, uint64_t *lo, uint64_t *hi, uint32_t *rank,
                           uint32_t *count);

/* 1 once psd said the plan's last round has closed: stop training (the
 * final model is in psd); 0 otherwise. */
PSC_API int psc_plan_done(const psc_client *c);

/* ---- embedding tables (proto/PROTOCOL.md section 13) ---------------------- */
/* Rows of `dim` floats addressed by arbitrary 64-bit keys, each with its
 * optimizer state on the psd of its part: with several psd, key k on part
 * jump_hash(mix(k), n) (PROTOCOL.md 13.7), each part's keys sent to its psd
 * at once; a batch pulls and pushes only the rows it touches. Keys may repeat
 * within a call: a pull fetches each distinct key once, a push sums a
 * key's gradients (in the order they come) and sends each distinct key
 * once. Calls are split into messages of at most 65,536 keys and 2^22
 * values. */

/* Declares table `name` (1..63 printable bytes) after psc_connect: rows
 * of dim values (1..1024) starting as "zeros", "uniform" (from
 * uniform(-scale, scale)) or "normal" (from normal(0, scale)), a function
 * of (seed, key) alone; optimizer opt "sgd", "adagrad", "adam" (lazy, with
 * per-row steps) or "ftrl"; hp its hyper-parameters as "lr=0.05,eps=1e-10"
 * (keys lr, eps, beta1, beta2, iacc, beta, l1, l2; NULL or "": the
 * defaults). Every worker declares a table the same way (psd refuses
 * another declaration: PSC_ELAYOUT). Returns 0, PSC_EINVAL (a bad
 * argument, said in psc_errmsg) or a code psd answered. (1.7) */
PSC_API int psc_table(psc_client *c, const char *name, uint32_t dim, const char *init, double scale, uint64_t seed,
                      const char *opt, const char *hp);

/* Pulls the rows of keys[0..n) of table name into rows (n x dim floats):
 * a key no push has reached yet gets its initial row. 0, PSC_ENOTFOUND
 * (not declared here) or a code. (1.7) */
PSC_API int psc_table_pull(psc_client *c, const char *name, const uint64_t *keys, size_t n, float *rows);

/* Pushes row gradients grads (n x dim floats) for keys[0..n) of table
 * name, computed on the model version of the parameters last pulled (in
 * bsp: push them before the step's psc_pushpull, whose round applies
 * them). 0, PSC_ENONFINITE (a gradient that is not finite: nothing sent)
 * or a code. (1.7) */
PSC_API int psc_table_push(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads);

/* psc_table_push, then psc_table_pull of next[0..m) into rows, in one
 * round trip to each psd (a TPUSHPULL; more messages when a side passes
 * one message's limits, a part's pulls after all its pushes). In bsp a
 * push for a round already closed is dropped and the rows are pulled all
 * the same (PROTOCOL.md 13.5), where psc_table_push says PSC_ESTALE. (1.7) */
PSC_API int psc_table_pushpull(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads,
                               const uint64_t *next, size_t m, float *rows);

/* ---- talking less: local SGD and elastic averaging (1.8) ------------------ */
/* In these jobs (psd's settings local_steps, elastic_alpha; PROTOCOL.md
 * section 8) the worker's own optimizer trains its own copy of the model,
 * the parameter vector, and the library exchanges it with psd every few
 * steps. The loop: compute the gradient, take your optimizer's step on
 * the parameter vector, call psc_local_step. Neither psc_push nor
 * psc_pushpull is called then. */

/* H, the local steps between two rounds of a local-SGD job (psd's
 * local_steps, from its WELCOME); 0 in any other job. */
PSC_API uint32_t psc_local_steps(const psc_client *c);

/* 1 in an elastic-averaging job, with psd's alpha and tau (local steps
 * between two exchanges) in the arguments that are not NULL; 0 otherwise. */
PSC_API int psc_elastic(const psc_client *c, double *alpha, uint32_t *tau);

/* Tells the library the caller took one local step on the parameter
 * vector. Every H-th (local SGD) it pushes the difference between the
 * model it pulled last and the parameter vector as this worker's push of
 * the BSP round, and pulls the round's mean model into the parameter
 * vector; every tau-th (elastic averaging) it pulls psd's model c (the
 * centre), moves the parameter vector w by e = alpha (w - c) towards it
 * and pushes -e, which psd adds to the centre. The gradient vector is
 * overwritten (it holds what was pushed); buffers go as their values and
 * keep the local ones. Any other step sends nothing. Returns 1 after an
 * exchange, 0 after a step that sent nothing, or a code: PSC_ESTATE in a
 * job of neither kind. A reconnect loses the local steps since the last
 * exchange (counted in psc_lost_steps): the parameter vector then holds
 * psd's model. */
PSC_API int psc_local_step(psc_client *c);

/* Reconnects now (as a failed call would with "reconnect" on). */
PSC_API int psc_reconnect(psc_client *c);

/* ---- what psd said --------------------------------------------------------- */

PSC_API const char *psc_mode(const psc_client *c);      /* "asgd", "bsp", "ssp"; "" before connecting */
PSC_API uint64_t psc_model_version(const psc_client *c); /* of the parameters held (first psd's part) */
PSC_API void psc_shard(const psc_client *c, uint32_t *k, uint32_t *m);
PSC_API uint32_t psc_servers(const psc_client *c);       /* psd sharing the model */
PSC_API const char *psc_wire(const psc_client *c);       /* "f32" or "bf16", as psd agreed */
PSC_API int psc_shm(const psc_client *c);                /* 1: tensors go through shared memory */
/* 1: every psd mapped this worker's table segment, so table pulls and
 * pushes go through shared memory (PROTOCOL.md 13.9; option shm). (1.9) */
PSC_API int psc_table_shm(const psc_client *c);
/* 1: psd runs a Hogwild! job and mapped this worker's segment: a push
 * (psc_push, psc_pushpull and their ranges) is w -= lr * g applied by the
 * caller's thread straight into psd's model, at psd's lr, without a
 * message; a pull copies the model from there (PROTOCOL.md 8). (1.8) */
PSC_API int psc_hogwild(const psc_client *c);
/* psd's model itself while psc_hogwild() is 1 (psc_size() floats, which
 * other workers write at the same time), else NULL. The address holds until
 * psc_free, also across reconnects: psc_bind it as the parameter vector
 * and pulls copy nothing. (1.8) */
PSC_API float *psc_hogwild_params(psc_client *c);
PSC_API uint64_t psc_reconnects(const psc_client *c);
/* How far behind its leader the psd that answered the last pull (or table
 * pull) was: the bytes of the leader's replication log it had not applied,
 * when it is a follower (a read replica, option reader); -1 when it is a
 * leader or no pull was answered yet. With several psd, the most of the
 * parts' last answers. (1.12) */
PSC_API int64_t psc_lag(const psc_client *c);
PSC_API uint64_t psc_lost_steps(const psc_client *c);    /* steps lost to reconnects */
PSC_API uint64_t psc_dropped(const psc_client *c);       /* pushes psd dropped (bsp round closed) */

/* What psd last said the step in flight waits for, for people: "round 3
 * waits for shard 2/3 (never joined)", "round 3 waits for shard 1/3 (has
 * not pushed)", "clock 7 waits for shard 0/2 (more than 2 clocks behind)",
 * "psd is paused (psctl resume)" (since 1.3). psd tells it (a psd that
 * knows the heartbeat's "wait") in answer to the library's heartbeats while one
 * of this worker's pulls is parked, so it arrives a heartbeat interval (a
 * third of psd's heartbeat_timeout) or less after the wait began. Copies
 * it, NUL-terminated and truncated to len - 1 bytes, into buf (nothing when
 * len is 0) and returns its length; returns 0 with buf "" when there is
 * nothing to tell: no step in flight, the step did not wait, psd has not
 * said yet, or an older psd. With several psd, the last one that spoke.
 * Unlike the other calls it may be called from any thread, also while
 * another one is inside a step on c (psworker's progress line does); the
 * text is the caller's copy, so nothing to free or keep alive. */
PSC_API size_t psc_waiting_for(psc_client *c, char *buf, size_t len);

/* The last error on c, one line for people ("no error" when none). */
PSC_API const char *psc_errmsg(const psc_client *c);

#ifdef __cplusplus
}
#endif
#endif
