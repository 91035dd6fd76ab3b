/* conn.h - a blocking connection to psd, the one under libpsclient (client/)
 * and psctl: it is not the client library, only its wire end.
 *
 * One ps_conn is one TCP connection: connect with a deadline, the hello
 * handshake, request ids, and send/receive of whole frames. Tensor data is
 * sent straight from the caller's memory (writev) and received into the
 * client's own buffer, where the decoded message points: a received message
 * stays valid until the next receive on the same client.
 *
 * Functions return 0 or a negative PS_E* code and leave a readable reason in
 * ps_conn_error(). A reply of type ERROR from psd is returned as
 * PS_EREMOTE, with psd's code in ps_conn.remote_code and its message in the
 * error text. Not thread-safe: one thread per client at a time. */
#ifndef PS_CONN_H
#define PS_CONN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/codec.h"
#include "proto/msg.h"

typedef struct ps_conn {
    int fd;                   /* -1 when not connected */
    char server[300];         /* "host:port" as given */
    uint64_t next_id;         /* request id of the next request */
    uint8_t *rbuf;            /* payload of the last frame received */
    size_t rcap;
    uint32_t max_frame;       /* largest payload accepted from psd */
    msgpack_zone zone;        /* unpack zone, cleared before each receive */
    ps_buf wbuf;              /* encode scratch */
    ps_layout scratch_layout; /* for replies that carry a layout */
    int32_t remote_code;      /* code of the last ERROR reply (positive) */
    char remote_leader[PS_ADDR_MAX + 1]; /* its "leader" (NOT_LEADER: the psd
                               * to go to); "" when it had none */
    uint32_t wire_dt;         /* ps_dtype of pushed gradients and pulled
                               * parameters (PUSH, PUSHPULL, PULL): PS_DT_F32
                               * unless set after a WELCOME that offered another */
    uint16_t *narrow;         /* gradients converted for sending, or parameters
                               * read before widening (wire_dt bf16) */
    size_t narrow_cap;        /* values */
    int skip_zeros;           /* psd offered float32 without zeros (dt f32z) and the
                               * owner wants it: ps_conn_send then leaves +0.0
                               * values out of float32 pushes when that saves a
                               * sixteenth of the bytes or more (0 after init) */
    int compress;             /* psd offered compressed float32 (dt zstd) and the owner
                               * wants it: float32 pushes go as one zstd frame when
                               * that saves a sixteenth of the bytes or more (tried
                               * before skip_zeros), and PULL and PUSHPULL ask for
                               * their parameters so (rdt 3; psd sends float32 when
                               * that saves less); 0 after init */
    unsigned zrest;           /* compress: pushes still to send as they are after one
                               * whose frame did not save a sixteenth (PS_ZSTD_REST) */
    ps_codec codec;           /* zstd's contexts (proto/codec.h): the compressor made at
                               * the first compressed push, the decompressor at the
                               * first compressed reply */
    uint8_t *zbuf;            /* such a push's bitmap and values, or its frame */
    size_t zbuf_cap;          /* bytes */
    uint8_t *zshuf;           /* a push's values as byte planes, before compressing */
    size_t zshuf_cap;         /* bytes */
    uint8_t *zin;             /* a compressed reply's byte planes (the receiving side's:
                               * one thread may send while another receives) */
    size_t zin_cap;           /* bytes */
    float *wide;              /* a reply's bfloat16 data as float32 */
    size_t wide_cap;          /* values */
    pthread_mutex_t *send_lock; /* when set, held around every send, so a heartbeat
                                 * thread may send too; the owner holds it
                                 * itself around connect and close */
    int has_slice;            /* the last PARAMS received carried "slice": */
    ps_slice slice;           /* it (a BSP job's plan: the round it opened) */
    int done;                 /* the last PARAMS said "done": the plan is over */
    int64_t lag;              /* the last PARAMS or ROWS's "lag" (a follower: bytes of its
                               * leader's log not applied); -1 when it had none */
    /* psd's answer to a heartbeat that asked "wait" (an OK with "wait"):
     * what a parked pull waits for. Every receive consumes such an OK
     * without returning it, calls on_wait (when set) with its text (not
     * NUL-terminated; valid during the call only) from the receiving
     * thread, and reads on. */
    void (*on_wait)(void *arg, const char *text, size_t len);
    void *on_wait_arg;
    int spin_us;              /* a wait for a reply first polls the socket this
                               * many microseconds, yielding the CPU between
                               * polls, before it sleeps (0: sleeps at once) */
    int *interrupted;         /* NULL: waits go on through signals. Else (shared
                               * by the owner's connections): a wait that a signal
                               * interrupts (a handler ran) sets *interrupted, and
                               * every wait ends with PS_CLIENT_EINTR while it is
                               * set, until the owner clears it */
    int wake_fd;              /* -1: none. Else, with interrupted set, a
                               * descriptor a signal makes readable (a
                               * self-pipe: Python's signal.set_wakeup_fd),
                               * watched beside the socket: readable, the
                               * wait ends as a signal's EINTR would. So a
                               * signal that lands before the wait sleeps,
                               * or on another thread, still ends it. The
                               * owner empties it when a call begins */
    char err[1024];           /* last error, for people */
} ps_conn;

/* Not a wire code: a wait ended by a signal (interrupted). The
 * connection may then be in the middle of a frame: close it. */
#define PS_CLIENT_EINTR (-100)

/* After a push that compressing did not make a sixteenth smaller, this many
 * go as they are before compressing is tried again: a tensor that does not
 * compress does not cost a compressor's pass every push. */
#define PS_ZSTD_REST 32

/* Prepares c (no connection yet). Call ps_conn_free when done. */
void ps_conn_init(ps_conn *c);
void ps_conn_free(ps_conn *c);

/* Connects to "host:port" within timeout_ms (-1: no limit), resolving the
 * name included, with TCP_NODELAY. Returns 0, PS_EINVAL for a bad address,
 * PS_ECONNECT or PS_ETIMEOUT. */
int ps_conn_connect(ps_conn *c, const char *hostport, int timeout_ms);

/* Closes the connection (if any); c can connect again. */
void ps_conn_close(ps_conn *c);

/* Sends m as one frame: assigns m->id (and sets PS_F_ID) from next_id
 * unless m already has one. Tensor bytes go straight from m->data; with
 * wire_dt bf16, a PUSH's or PUSHPULL's float32 data is converted first, and
 * PULL and PUSHPULL ask for the reply in bfloat16 ("rdt"); with compress or
 * skip_zeros, float32 data of an INIT, PUSH or PUSHPULL may go compressed or
 * without its zeros. */
int ps_conn_send(ps_conn *c, ps_msg *m);

/* Receives one frame within timeout_ms (-1: no limit) and decodes it into
 * out (psd's wait notices are consumed on the way, see on_wait). out (its data, text and body) is valid until the next receive. An
 * ERROR message is returned as PS_EREMOTE (out still holds it). Tensor data
 * that came as bfloat16 is widened into the client's `wide` buffer: out's
 * data is always float32. */
int ps_conn_recv(ps_conn *c, ps_msg *out, int timeout_ms);
/* As ps_conn_recv, for a reply expected to carry n floats of tensor data
 * (PARAMS): when it does, they are read straight into dst (no copy from the
 * receive buffer) and out->data points at dst. Any other reply (an ERROR,
 * another length) is received as ps_conn_recv does. */
int ps_conn_recv_into(ps_conn *c, ps_msg *out, float *dst, size_t n, int timeout_ms);

/* Pulls parameters [base, base + n) at version >= min into dst[0, n), as
 * PULLs of at most `chunk` floats with `window` of them in flight (the next
 * chunk is on the wire while this one is read), each read straight into
 * dst. *version is the version of the last chunk. libpsclient's and
 * psbench's chunked pulls. */
int ps_conn_pull_chunks(ps_conn *c, float *dst, uint64_t base, uint64_t n, uint64_t min, uint64_t chunk,
                          unsigned window, uint64_t *version, int timeout_ms);

/* Sends m without a request id: psd sends no reply (heartbeats). */
int ps_conn_send_noreply(ps_conn *c, ps_msg *m);

/* The same for a caller that already holds *send_lock (a heartbeat thread
 * that waits on a condition variable with it). */
int ps_conn_send_noreply_held(ps_conn *c, ps_msg *m);

/* send + recv; checks that the reply's id matches the request's. */
int ps_conn_call(ps_conn *c, ps_msg *req, ps_msg *reply, int timeout_ms);

/* One ADMIN request, cmd with its n arguments (at most PS_ARGS_MAX), and
 * its reply in r, as ps_conn_call: psctl's commands, a follower's
 * `replicate`, `repl_chunk` and `step_down`. */
int ps_conn_admin(ps_conn *c, const char *cmd, const char *const *args, unsigned n, ps_msg *r, int timeout_ms);

/* The handshake: sends hello (a HELLO the caller filled in) and returns
 * psd's WELCOME in welcome (valid until the next receive). When psd
 * requires a token it answers with a CHALLENGE instead, and this proves
 * token[0..token_len) without sending it (AUTH, proto/PROTOCOL.md 7.1) and
 * checks psd's proof in the WELCOME that follows. token may be NULL with
 * token_len 0: a psd that asks for none is then fine, and one that does is
 * PS_EAUTH ("psd requires a token: pass --token-file"); a token psd does not
 * need is ignored. Returns 0, PS_EREMOTE for psd's ERROR (AUTH for a wrong
 * token, LAYOUT, ...), PS_EAUTH when psd cannot prove it holds the token,
 * PS_EMALFORMED for an unexpected reply, or an I/O code. Call it once per
 * connection, right after ps_conn_connect (and after every reconnect).
 * timeout_ms bounds the whole handshake, its AUTH round included. */
int ps_conn_hello(ps_conn *c, ps_msg *hello, const uint8_t *token, size_t token_len, ps_msg *welcome,
                    int timeout_ms);

/* Swaps the client's receive buffer with (*buf, *cap): afterwards the
 * caller owns the buffer the last message was received into (its data
 * stays valid), and the client receives into the one handed over (which may
 * be NULL with cap 0; it grows as needed). For double-buffering pulled
 * parameters without a copy. */
void ps_conn_swap_rbuf(ps_conn *c, uint8_t **buf, size_t *cap);
/* The same for the buffer that received bfloat16 data was widened into. */
void ps_conn_swap_wide(ps_conn *c, float **buf, size_t *cap);

/* The last error as one readable line. */
const char *ps_conn_error(const ps_conn *c);

#endif
