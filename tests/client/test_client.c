/* test_client.c - libpsclient's public API (include/psd/client.h) against a
 * real psd, started by each test on a free port of 127.0.0.1 and killed at
 * its end. psd runs plain SGD with lr 0.5 and no momentum, so every
 * expected value is exact: init - 0.5 x gradient (x the mean in bsp).
 *
 *   test_client PSD_BINARY WORK_DIR */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "psd/client.h"

static const char *psd_bin, *work_dir;

/* every psd started, killed at exit too: a failed assertion leaves its
 * test without reaching psd_kill */
static pid_t started[64];
static int nstarted;

static void kill_started(void)
{
    for (int i = 0; i < nstarted; i++)
        if (started[i] > 0 && kill(started[i], SIGKILL) == 0)
            waitpid(started[i], NULL, 0);
}

typedef struct psd_proc {
    pid_t pid;
    int port;
    char addr[64];
    char dir[512];
} psd_proc;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Starts psd on 127.0.0.1:port (0: any free one) in mode, with extra
 * "--set" settings (NULL-terminated), and waits for its port file. */
static void psd_start(psd_proc *p, const char *mode, int workers, int port, ...)
{
    static int seq;
    char *argv[40];
    int n = 0;
    char listen[64], wk[16], port_file[600];
    if (!p->dir[0]) {
        snprintf(p->dir, sizeof p->dir, "%s/psd-%d-%d", work_dir, (int)getpid(), seq++);
        mkdir(p->dir, 0700);
    }
    snprintf(port_file, sizeof port_file, "%s/port", p->dir);
    unlink(port_file);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(wk, sizeof wk, "%d", workers);
    argv[n++] = (char *)psd_bin;
    argv[n++] = "--listen";
    argv[n++] = listen;
    argv[n++] = "--port-file";
    argv[n++] = port_file;
    argv[n++] = "--mode";
    argv[n++] = (char *)mode;
    argv[n++] = "--workers";
    argv[n++] = wk;
    argv[n++] = "--log-level";
    argv[n++] = "warn";
    argv[n++] = "--set";
    argv[n++] = "optimizer=sgd";
    argv[n++] = "--set";
    argv[n++] = "lr=0.5";
    argv[n++] = "--set";
    argv[n++] = "momentum=0";
    argv[n++] = "--set";
    argv[n++] = "warmup_versions=0";
    va_list ap;
    va_start(ap, port);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL && n < 38;) {
        argv[n++] = "--set";
        argv[n++] = (char *)s;
    }
    va_end(ap);
    argv[n] = NULL;
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        execv(psd_bin, argv);
        _exit(127);
    }
    if (nstarted < 64)
        started[nstarted++] = p->pid;
    for (double t0 = now_s(); now_s() - t0 < 15;) {
        FILE *f = fopen(port_file, "r");
        int got = 0;
        if (f) {
            got = fscanf(f, "%d", &p->port) == 1;
            fclose(f);
        }
        if (got) {
            snprintf(p->addr, sizeof p->addr, "127.0.0.1:%d", p->port);
            return;
        }
        int st;
        assert_int_equal(waitpid(p->pid, &st, WNOHANG), 0); /* psd still running */
        usleep(10000);
    }
    fail_msg("psd did not write its port file within 15 s");
}

static void psd_kill(psd_proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        for (int i = 0; i < nstarted; i++)
            if (started[i] == p->pid)
                started[i] = 0; /* reaped: its pid may be another process's now */
        p->pid = 0;
    }
}

/* A port nothing listens on (bound, then closed). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A client of the two-tensor model w[ROWS x 3], b[3] for shard k of m. */
#define ROWS 400
#define NVAL (ROWS * 3 + 3)
static psc_client *client(const char *servers, const char *shard)
{
    psc_client *c = psc_new();
    assert_non_null(c);
    assert_int_equal(psc_set(c, "server", servers), 0);
    assert_int_equal(psc_set(c, "shard", shard), 0);
    assert_int_equal(psc_set(c, "connect_s", "5"), 0);
    assert_int_equal(psc_set(c, "timeout_ms", "20000"), 0);
    uint64_t w[2] = {ROWS, 3}, b[1] = {3};
    assert_int_equal(psc_add_tensor(c, "w", 2, w), 0);
    assert_int_equal(psc_add_tensor(c, "b", 1, b), 0);
    return c;
}

static float init_value(size_t i)
{
    return (float)(i % 17) * 0.25f - 2.0f;
}

/* ---- tests --------------------------------------------------------------- */

/* The first worker's values become the model; the second pulls them. A
 * pushpull applies -lr x gradient exactly, and both see it. */
static void test_init_and_pushpull(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_size(a), NVAL);
    float *pa = psc_params(a), *ga = psc_grads(a);
    assert_non_null(pa);
    for (size_t i = 0; i < NVAL; i++)
        pa[i] = init_value(i);
    assert_int_equal(psc_connect(a), 0);
    assert_string_equal(psc_mode(a), "asgd");
    assert_int_equal(psc_shm(a), 1); /* psd on this machine maps the segment */
    float *pb = psc_params(b);
    for (size_t i = 0; i < NVAL; i++)
        pb[i] = 99; /* not these: psd has a model already */
    assert_int_equal(psc_connect(b), 0);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(pb[i] == init_value(i));
    for (size_t i = 0; i < NVAL; i++)
        ga[i] = (float)(i % 3);
    assert_int_equal(psc_pushpull(a), 0);
    assert_int_equal(psc_model_version(a), 1);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(pa[i] == init_value(i) - 0.5f * (float)(i % 3));
    assert_int_equal(psc_pull(b), 0);
    assert_memory_equal(pa, pb, NVAL * sizeof(float));
    assert_int_equal(psc_report(a, 1, 0.5, 0.9, 0.4, 1000, 123.0), 0);
    assert_int_equal(psc_report(b, 1, 0.5, -1, 0, 1000, 123.0), 0);
    uint32_t rank, count;
    assert_int_equal(psc_live_shards(b, &rank, &count), 0);
    assert_int_equal(rank, 1);
    assert_int_equal(count, 2);
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

/* Hogwild!: a pushpull is p - lr x g in psd's model itself, which the
 * other worker sees at once; a push range steps only its range; the
 * version is the steps' count; psc_hogwild_params bound as the parameters
 * copies nothing; a restarted psd's segment is mapped at the same address;
 * a topk client is told nothing goes and steps all the same. */
static void test_hogwild(void **state)
{
    (void)state;
    psd_proc p = {0};
    int port = free_port();
    psd_start(&p, "asgd", 2, port, "hogwild=on", NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_set(b, "topk", "0.1"), 0);
    float *pa = psc_params(a), *ga = psc_grads(a);
    for (size_t i = 0; i < NVAL; i++)
        pa[i] = init_value(i);
    assert_null(psc_hogwild_params(a));
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), 0);
    assert_int_equal(psc_hogwild(a), 1);
    assert_int_equal(psc_hogwild(b), 1);
    float *hw = psc_hogwild_params(a), *hwb = psc_hogwild_params(b);
    assert_non_null(hw);
    assert_true(hw != hwb); /* each process's own mapping of one segment */
    for (size_t i = 0; i < NVAL; i++)
        ga[i] = (float)(i % 3);
    assert_int_equal(psc_pushpull(a), 0);
    assert_int_equal(psc_model_version(a), 1);
    for (size_t i = 0; i < NVAL; i++) {
        assert_true(pa[i] == init_value(i) - 0.5f * (float)(i % 3));
        assert_true(hwb[i] == pa[i]); /* b sees a's step in psd's model */
    }
    /* b binds psd's model as its parameters: pulls copy nothing */
    float *gb = psc_grads(b);
    assert_int_equal(psc_bind(b, hwb, NULL), 0);
    for (size_t i = 0; i < NVAL; i++)
        gb[i] = 1.0f;
    assert_int_equal(psc_push_range(b, 0, 10), 0); /* topk does not apply: every value of the range steps */
    assert_int_equal(psc_model_version(b), 2);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(hw[i] == init_value(i) - 0.5f * (float)(i % 3) - (i < 10 ? 0.5f : 0.0f));
    assert_int_equal(psc_pull(a), 0);
    assert_memory_equal(pa, hw, NVAL * sizeof(float));
    /* psd restarted (no state: a's values become the model again): the
     * next step notices, reconnects and maps the new segment in place */
    float before[NVAL];
    memcpy(before, pa, sizeof before);
    psd_kill(&p);
    psd_start(&p, "asgd", 2, port, "hogwild=on", NULL);
    memset(ga, 0, NVAL * sizeof(float)); /* steps that change nothing, until one notices */
    for (double t0 = now_s(); psc_reconnects(a) == 0 && now_s() - t0 < 5;)
        assert_int_equal(psc_pushpull(a), 0);
    assert_int_equal(psc_reconnects(a), 1);
    assert_int_equal(psc_hogwild(a), 1);
    assert_true(psc_hogwild_params(a) == hw);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(hw[i] == before[i]); /* the lost step was not applied; a's values are the new model */
    assert_int_equal(psc_pushpull(a), 0);
    assert_int_equal(psc_model_version(a), 1);
    assert_memory_equal(pa, before, NVAL * sizeof(float));
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

/* Named tensors and key ranges move only their values; the caller's own
 * vectors (psc_bind) work as the library's do; TCP (shm off) and bfloat16
 * give the same model. */
static void test_ranges_bind_wire(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_set(b, "shm", "off"), 0);
    assert_int_equal(psc_set(b, "wire", "bf16"), 0);
    float *mine = calloc(NVAL, sizeof(float)), *myg = calloc(NVAL, sizeof(float));
    for (size_t i = 0; i < NVAL; i++)
        mine[i] = 1.0f;
    assert_int_equal(psc_bind(a, mine, myg), 0);
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), 0);
    assert_int_equal(psc_shm(b), 0);
    assert_string_equal(psc_wire(b), "bf16");
    float *pb = psc_params(b), *gb = psc_grads(b);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(pb[i] == 1.0f); /* 1.0 is exact in bfloat16 */
    /* b pushes only tensor b (values ROWS*3 .. +3) */
    for (size_t i = 0; i < NVAL; i++)
        gb[i] = 1.0f;
    assert_int_equal(psc_push_tensor(b, "b"), 0);
    assert_int_equal(psc_pull(a), 0);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(mine[i] == (i >= ROWS * 3 ? 0.5f : 1.0f));
    /* a pushes the range [10, 20) of w from its own gradient vector */
    for (size_t i = 0; i < NVAL; i++)
        myg[i] = 2.0f;
    assert_int_equal(psc_push_range(a, 10, 10), 0);
    assert_int_equal(psc_pull_tensor(b, "w"), 0);
    for (size_t i = 0; i < ROWS * 3; i++)
        assert_true(pb[i] == (i >= 10 && i < 20 ? 0.0f : 1.0f));
    assert_int_equal(psc_pull_range(b, ROWS * 3, 3), 0);
    assert_true(pb[ROWS * 3] == 0.5f);
    /* bad ranges and names: refused by the library, the client still works */
    assert_int_equal(psc_push_range(a, NVAL - 1, 2), PSC_ERANGE);
    assert_non_null(strstr(psc_errmsg(a), "not inside"));
    assert_int_equal(psc_pull_range(a, 0, 0), PSC_ERANGE);
    assert_int_equal(psc_pull_tensor(a, "nope"), PSC_ENOTFOUND);
    assert_int_equal(psc_pull(a), 0);
    psc_free(a);
    psc_free(b);
    free(mine);
    free(myg);
    psd_kill(&p);
}

/* BSP with the asynchronous form: both workers start their step, neither
 * finishes before the other's push closes the round; the model moves by
 * the mean gradient. While a step is in flight other calls are refused. */
static void test_bsp_async(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "bsp", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), 0);
    assert_string_equal(psc_mode(b), "bsp");
    float *ga = psc_grads(a), *gb = psc_grads(b);
    for (size_t i = 0; i < NVAL; i++) {
        ga[i] = 1.0f;
        gb[i] = 3.0f;
    }
    assert_int_equal(psc_pushpull_start(a), 0);
    assert_int_equal(psc_pull(a), PSC_EBUSY);
    assert_int_equal(psc_bind(a, NULL, NULL), PSC_EBUSY);
    assert_int_equal(psc_pushpull_start(a), PSC_EBUSY);
    usleep(200000);
    assert_int_equal(psc_poll(a), 0); /* the round waits for b */
    assert_int_equal(psc_pushpull_start(b), 0);
    assert_int_equal(psc_wait(a), 0);
    assert_int_equal(psc_wait(b), 0);
    assert_int_equal(psc_poll(a), 1);
    assert_int_equal(psc_wait(a), 0); /* nothing in flight */
    assert_int_equal(psc_model_version(a), 1);
    float *pa = psc_params(a), *pb = psc_params(b);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(pa[i] == -1.0f && pb[i] == -1.0f); /* 0 - 0.5 x mean(1, 3) */
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

/* Waits up to 10 s for psc_waiting_for(c) to be want; fails with what it
 * said last. */
static void expect_waiting_for(psc_client *c, const char *want)
{
    char buf[256] = "";
    for (double t0 = now_s(); now_s() - t0 < 10; usleep(20000))
        if (psc_waiting_for(c, buf, sizeof buf) == strlen(want) && strcmp(buf, want) == 0)
            return;
    fail_msg("psc_waiting_for said \"%s\", expected \"%s\"", buf, want);
}

/* A BSP worker whose round waits learns from psd, through its heartbeats,
 * whom it waits for: a shard that never joined, one that has not pushed;
 * from another thread while the step is in flight. Nothing before a step
 * and after it. */
static void test_waiting_for(void **state)
{
    psd_proc p = {0};
    /* heartbeats every 100 ms */
    psd_start(&p, "bsp", 3, 0, "heartbeat_timeout=300ms", "join_timeout=60s", NULL);
    psc_client *a = client(p.addr, "0/3"), *b = client(p.addr, "1/3");
    char buf[256] = "x";
    assert_int_equal(psc_waiting_for(a, buf, sizeof buf), 0); /* not connected */
    assert_string_equal(buf, "");
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), 0);
    assert_int_equal(psc_waiting_for(a, buf, sizeof buf), 0);
    assert_int_equal(psc_pushpull_start(a), 0);
    expect_waiting_for(a, "round 0 waits for shard 2/3 (never joined) and shard 1/3 (has not pushed)");
    assert_int_equal(psc_poll(a), 0);
    assert_int_equal(psc_pushpull_start(b), 0);
    expect_waiting_for(a, "round 0 waits for shard 2/3 (never joined)");
    expect_waiting_for(b, "round 0 waits for shard 2/3 (never joined)");
    /* a short buffer gets the text's start; the length is the whole */
    char small[6];
    assert_int_equal(psc_waiting_for(a, small, sizeof small), strlen("round 0 waits for shard 2/3 (never joined)"));
    assert_string_equal(small, "round");
    assert_int_equal(psc_waiting_for(a, NULL, 0), strlen("round 0 waits for shard 2/3 (never joined)"));
    /* the third joins and pushes: the round closes, nothing is awaited */
    psc_client *c = client(p.addr, "2/3");
    assert_int_equal(psc_connect(c), 0);
    assert_int_equal(psc_pushpull(c), 0);
    assert_int_equal(psc_wait(a), 0);
    assert_int_equal(psc_wait(b), 0);
    assert_int_equal(psc_model_version(a), 1);
    assert_int_equal(psc_waiting_for(a, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(psc_waiting_for(b, buf, sizeof buf), 0);
    assert_int_equal(psc_waiting_for(NULL, buf, sizeof buf), 0);
    psc_free(a);
    psc_free(b);
    psc_free(c);
    psd_kill(&p);
}

/* A BSP job by its plan: the first worker's plan is the job's and the
 * second learns it; each pull that opens a round tells each its part of the
 * round's global batch; after the last round both hear done and a further
 * step changes nothing. */
static void test_plan(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "bsp", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_plan_set(a, 0, 10, 4, 1), PSC_EINVAL);
    assert_int_equal(psc_plan_set(a, 1, 10, 11, 1), PSC_EINVAL);
    assert_int_equal(psc_plan_set(a, 2, 10, 4, 7), 0); /* rounds of 4, 4, 2 samples: 6 */
    assert_int_equal(psc_plan_set(b, 9, 99, 9, 9), 0); /* not the job's: a's came first */
    assert_int_equal(psc_plan(a, NULL, NULL, NULL, NULL), 0); /* not connected */
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), 0);
    assert_int_equal(psc_plan_set(a, 2, 10, 4, 7), PSC_ESTATE);
    uint64_t e, n, bt, seed;
    assert_int_equal(psc_plan(b, &e, &n, &bt, &seed), 1);
    assert_true(e == 2 && n == 10 && bt == 4 && seed == 7);
    uint64_t ep, lo, hi;
    uint32_t rank, count;
    assert_int_equal(psc_plan_slice(a, &ep, &lo, &hi, &rank, &count), 1);
    assert_true(ep == 0 && lo == 0 && hi == 2 && rank == 0 && count == 2);
    assert_int_equal(psc_plan_slice(b, &ep, &lo, &hi, &rank, &count), 1);
    assert_true(ep == 0 && lo == 2 && hi == 4 && rank == 1 && count == 2);
    static const uint64_t want_lo[] = {4, 8, 0, 4, 8};
    for (int r = 0; r < 6; r++) {
        assert_false(psc_plan_done(a));
        assert_int_equal(psc_pushpull_start(a), 0);
        assert_int_equal(psc_pushpull(b), 0);
        assert_int_equal(psc_wait(a), 0);
        assert_int_equal(psc_model_version(a), r + 1);
        if (r < 5) {
            uint64_t len = want_lo[r] == 8 ? 2 : 4;
            assert_int_equal(psc_plan_slice(b, &ep, &lo, &hi, &rank, &count), 1);
            assert_true(ep == (uint64_t)(r + 1) / 3 && lo == want_lo[r] + len / 2 && hi == want_lo[r] + len);
        }
    }
    assert_true(psc_plan_done(a) && psc_plan_done(b));
    assert_int_equal(psc_plan_slice(a, NULL, NULL, NULL, NULL, NULL), 0);
    /* a step past the plan: dropped, answered at once, the model stays */
    assert_int_equal(psc_pushpull(a), 0);
    assert_int_equal(psc_model_version(a), 6);
    assert_int_equal(psc_dropped(a), 1);
    assert_true(psc_plan_done(a));
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

/* A worker of shard `shard` of a model of one tensor v of 5,000 values
 * split over the two psd of `servers`: v[i] = i, its gradient 2, connected
 * (its values the model when it is the first) and one step pushed. */
static psc_client *split_client(const char *servers, const char *shard, int interrupt)
{
    psc_client *c = psc_new();
    assert_int_equal(psc_set(c, "server", servers), 0);
    assert_int_equal(psc_set(c, "shard", shard), 0);
    if (interrupt) {
        assert_int_equal(psc_set(c, "interrupt", "on"), 0);
        assert_int_equal(psc_set(c, "timeout_ms", "20000"), 0);
    }
    uint64_t d[1] = {5000};
    assert_int_equal(psc_add_tensor(c, "v", 1, d), 0);
    float *pc = psc_params(c), *gc = psc_grads(c);
    for (size_t i = 0; i < 5000; i++) {
        pc[i] = (float)i;
        gc[i] = 2.0f;
    }
    assert_int_equal(psc_connect(c), 0);
    assert_int_equal(psc_servers(c), 2);
    assert_int_equal(psc_pushpull(c), 0);
    return c;
}

/* A model split over two psd: the parts go to their psd, and a worker
 * joining later pulls both. */
static void test_split(void **state)
{
    psd_proc p1 = {0}, p2 = {0};
    psd_start(&p1, "asgd", 2, 0, NULL);
    psd_start(&p2, "asgd", 2, 0, NULL);
    char servers[200];
    snprintf(servers, sizeof servers, "%s,%s", p1.addr, p2.addr);
    psc_client *c = split_client(servers, "0/2", 0);
    float *pc = psc_params(c);
    uint64_t d[1] = {5000};
    psc_client *o = psc_new();
    assert_int_equal(psc_set(o, "server", servers), 0);
    assert_int_equal(psc_set(o, "shard", "1/2"), 0);
    assert_int_equal(psc_add_tensor(o, "v", 1, d), 0);
    assert_int_equal(psc_connect(o), 0);
    float *po = psc_params(o);
    for (size_t i = 0; i < 5000; i++)
        assert_true(po[i] == (float)i - 1.0f && pc[i] == po[i]);
    /* a range across the two parts' boundary */
    assert_int_equal(psc_push_range(c, 2000, 2000), 0);
    assert_int_equal(psc_pull(o), 0);
    for (size_t i = 0; i < 5000; i++)
        assert_true(po[i] == (float)i - (i >= 2000 && i < 4000 ? 2.0f : 1.0f));
    psc_free(c);
    psc_free(o);
    psd_kill(&p1);
    psd_kill(&p2);
}

/* A worker started before psd waits for it; killed and restarted (without
 * its state), psd gets the worker's parameters back and training goes on. */
typedef struct {
    psc_client *c;
    int rc;
} connect_arg;

static void *connect_thread(void *arg)
{
    connect_arg *ca = arg;
    ca->rc = psc_connect(ca->c);
    return NULL;
}

static void test_wait_and_reconnect(void **state)
{
    int port = free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_client *c = client(addr, "0/1");
    assert_int_equal(psc_set(c, "connect_s", "20"), 0);
    assert_int_equal(psc_set(c, "reconnect_s", "20"), 0);
    float *pc = psc_params(c), *gc = psc_grads(c);
    for (size_t i = 0; i < NVAL; i++)
        pc[i] = 4.0f;
    connect_arg ca = {c, -999};
    pthread_t th;
    double t0 = now_s();
    assert_int_equal(pthread_create(&th, NULL, connect_thread, &ca), 0);
    usleep(500000);
    psd_proc p = {0};
    psd_start(&p, "asgd", 1, port, NULL);
    pthread_join(th, NULL);
    assert_int_equal(ca.rc, 0);
    assert_true(now_s() - t0 >= 0.45);
    for (size_t i = 0; i < NVAL; i++)
        gc[i] = 1.0f;
    assert_int_equal(psc_pushpull(c), 0);
    assert_true(pc[0] == 3.5f);
    psd_kill(&p);
    psd_start(&p, "asgd", 1, port, NULL);
    assert_int_equal(psc_pushpull(c), 0); /* reconnected, the step's push sent again */
    assert_int_equal(psc_reconnects(c), 1);
    assert_int_equal(psc_lost_steps(c), 0);
    for (size_t i = 0; i < NVAL; i++)
        assert_true(pc[i] == 3.0f); /* the new psd took our values, then applied the push once */
    assert_int_equal(psc_pushpull(c), 0);
    assert_true(pc[0] == 2.5f);
    psc_free(c);
    psd_kill(&p);
}

/* psd at its connection limit answers LIMIT: psc_connect retries with
 * backoff and gets in once a place is free. */
typedef struct {
    psc_client *c;
} close_arg;

static void *close_later(void *arg)
{
    usleep(700000);
    psc_close(((close_arg *)arg)->c);
    return NULL;
}

static void test_limit_retried(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, "max_connections=1", NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "1/2");
    assert_int_equal(psc_connect(a), 0);
    close_arg ca = {a};
    pthread_t th;
    double t0 = now_s();
    assert_int_equal(pthread_create(&th, NULL, close_later, &ca), 0);
    assert_int_equal(psc_connect(b), 0); /* LIMIT until a leaves */
    assert_true(now_s() - t0 >= 0.6);
    pthread_join(th, NULL);
    assert_int_equal(psc_pull(b), 0);
    psc_free(a);
    psc_free(b);
    /* with no wait allowed, LIMIT is the answer */
    psd_kill(&p);
    psd_start(&p, "asgd", 2, 0, "max_connections=1", NULL);
    a = client(p.addr, "0/2");
    b = client(p.addr, "1/2");
    assert_int_equal(psc_set(b, "connect_s", "0"), 0);
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_connect(b), PSC_ELIMIT);
    assert_non_null(strstr(psc_errmsg(b), "max_connections"));
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

/* Options chunk and pull_window: the model's 1203 values over TCP in
 * chunks of 1024 (two pushes, two pulls), with each chunk request waiting
 * for its reply (window 0) and with 3 in flight, and through the segment
 * (one PUSHPULL whatever the chunk): every value exact after each step. */
static void test_chunk_options(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 3, 0, NULL);
    psc_client *cs[3];
    const char *windows[3] = {"0", "3", "2"};
    for (int k = 0; k < 3; k++) {
        char shard[8];
        snprintf(shard, sizeof shard, "%d/3", k);
        cs[k] = client(p.addr, shard);
        assert_int_equal(psc_set(cs[k], "chunk", "1024"), 0);
        assert_int_equal(psc_set(cs[k], "pull_window", windows[k]), 0);
        assert_int_equal(psc_set(cs[k], "shm", k == 2 ? "on" : "off"), 0);
        float *pk = psc_params(cs[k]);
        for (size_t i = 0; i < NVAL; i++)
            pk[i] = init_value(i);
        assert_int_equal(psc_connect(cs[k]), 0);
        assert_int_equal(psc_shm(cs[k]), k == 2);
    }
    float want[NVAL];
    for (size_t i = 0; i < NVAL; i++)
        want[i] = init_value(i);
    for (int step = 0; step < 6; step++) {
        psc_client *c = cs[step % 3];
        float *g = psc_grads(c), *w = psc_params(c);
        for (size_t i = 0; i < NVAL; i++) {
            g[i] = (float)((i + (size_t)step) % 5) - 2.0f;
            want[i] -= 0.5f * g[i];
        }
        assert_int_equal(step % 2 ? psc_pushpull(c) : psc_push(c), 0);
        if (step % 2 == 0)
            assert_int_equal(psc_pull(c), 0);
        for (size_t i = 0; i < NVAL; i++)
            assert_true(w[i] == want[i]);
    }
    assert_int_equal(psc_model_version(cs[2]), 6);
    for (int k = 0; k < 3; k++)
        psc_free(cs[k]);
    psd_kill(&p);
}

/* Mistakes get a code and a message, never a crash; the client survives. */
static void test_mistakes(void **state)
{
    psc_client *c = psc_new();
    assert_int_equal(psc_set(c, "colour", "blue"), PSC_EINVAL);
    assert_non_null(strstr(psc_errmsg(c), "colour"));
    assert_int_equal(psc_set(c, "shard", "3/2"), PSC_EINVAL);
    assert_int_equal(psc_set(c, "wire", "f64"), PSC_EINVAL);
    assert_int_equal(psc_set(c, "timeout_ms", "0"), PSC_EINVAL);
    assert_int_equal(psc_set(c, "chunk", "1000"), PSC_EINVAL);
    assert_non_null(strstr(psc_errmsg(c), "1024..16777216"));
    assert_int_equal(psc_set(c, "pull_window", "65"), PSC_EINVAL);
    assert_int_equal(psc_set(c, NULL, "x"), PSC_EINVAL);
    assert_int_equal(psc_set(c, "token_file", "/nonexistent/token"), PSC_EINVAL);
    assert_non_null(strstr(psc_errmsg(c), "/nonexistent/token"));
    uint64_t d0[1] = {0}, d[2] = {2, 2};
    assert_int_equal(psc_add_tensor(c, "x", 1, d0), PSC_EINVAL);
    assert_int_equal(psc_add_tensor(c, "", 1, d), PSC_EINVAL);
    assert_int_equal(psc_add_tensor(c, "x", 7, d), PSC_EINVAL);
    assert_null(psc_params(c)); /* no tensors: no vectors */
    assert_int_equal(psc_connect(c), PSC_ESTATE);
    assert_int_equal(psc_add_tensor(c, "x", 2, d), 0);
    assert_int_equal(psc_add_tensor(c, "x", 2, d), PSC_EINVAL); /* twice */
    assert_int_equal(psc_pushpull(c), PSC_ESTATE);             /* not connected */
    assert_non_null(strstr(psc_errmsg(c), "psc_connect first"));
    assert_non_null(psc_params(c));
    assert_int_equal(psc_add_tensor(c, "y", 2, d), PSC_ESTATE); /* layout fixed */
    int port = free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    psc_client *u = psc_new();
    assert_int_equal(psc_set(u, "server", addr), 0);
    assert_int_equal(psc_set(u, "connect_s", "0"), 0);
    assert_int_equal(psc_add_tensor(u, "x", 2, d), 0);
    assert_int_equal(psc_connect(u), PSC_ECONNECT);
    assert_non_null(strstr(psc_errmsg(u), addr));
    psc_free(u);
    /* a bad list of psd is told when the layout is fixed, and may be mended */
    psc_client *r = psc_new();
    assert_int_equal(psc_set(r, "server", "127.0.0.1:1,,127.0.0.1:2"), 0);
    uint64_t big[1] = {4096};
    assert_int_equal(psc_add_tensor(r, "v", 1, big), 0);
    assert_null(psc_params(r));
    assert_non_null(strstr(psc_errmsg(r), "empty"));
    assert_int_equal(psc_set(r, "server", "127.0.0.1:1,127.0.0.1:2"), 0);
    assert_non_null(psc_params(r));
    assert_int_equal(psc_servers(r), 2);
    psc_free(r);
    /* psd holding another layout */
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2");
    assert_int_equal(psc_connect(a), 0);
    psc_client *z = psc_new();
    assert_int_equal(psc_set(z, "server", p.addr), 0);
    assert_int_equal(psc_set(z, "shard", "1/2"), 0);
    assert_int_equal(psc_add_tensor(z, "x", 2, d), 0);
    assert_int_equal(psc_connect(z), PSC_ELAYOUT);
    psc_free(z);
    psc_close(a);
    assert_int_equal(psc_pull(a), PSC_ESTATE);
    assert_non_null(strstr(psc_errmsg(a), "closed"));
    psc_close(a); /* twice is fine */
    psc_free(a);
    psc_free(c);
    psc_free(NULL);
    for (int code = 0; code >= -30; code--)
        assert_non_null(psc_strerror(code));
    assert_string_equal(psc_version_string(), "1.10.0");
    char macros[32]; /* the header's numbers say the same */
    snprintf(macros, sizeof macros, "%d.%d.%d", PSC_VERSION_MAJOR, PSC_VERSION_MINOR, PSC_VERSION_PATCH);
    assert_string_equal(psc_version_string(), macros);
    psd_kill(&p);
}

/* Embedding tables (1.7): declared, pulled and pushed by key; a key twice
 * in a call is pulled once and its gradients summed; calls of more keys
 * than a message holds are split; a psd restarted without its state gets
 * the tables declared again. */
static void test_tables(void **state)
{
    int port = free_port();
    psd_proc p = {0};
    psd_start(&p, "asgd", 1, port, NULL);
    psc_client *c = client(p.addr, "0/1");
    assert_int_equal(psc_set(c, "reconnect_s", "20"), 0);
    assert_int_equal(psc_table(c, "emb", 3, "zeros", 0, 0, "sgd", "lr=0.5"), PSC_ESTATE);
    assert_int_equal(psc_connect(c), 0);
    assert_int_equal(psc_table(c, "emb", 3, "zeros", 0, 0, "sgd", "lr=0.5"), 0);
    assert_int_equal(psc_table(c, "emb", 3, "zeros", 0, 0, "sgd", "lr=0.5"), 0); /* again: the same */
    assert_int_equal(psc_table(c, "emb", 4, "zeros", 0, 0, "sgd", "lr=0.5"), PSC_ELAYOUT);
    assert_non_null(strstr(psc_errmsg(c), "declared as dim 4"));
    assert_int_equal(psc_table(c, "x", 3, "zeros", 0, 0, "sgd", "momentum=0.9"), PSC_EINVAL);
    assert_non_null(strstr(psc_errmsg(c), "not 'momentum=0.9'"));
    assert_int_equal(psc_table(c, "x", 3, "ones", 0, 0, "sgd", NULL), PSC_EINVAL);
    assert_non_null(strstr(psc_errmsg(c), "unknown rinit 'ones'"));
    assert_int_equal(psc_table(c, "x", 3, "uniform", 0.1, 0, "adagrad", "beta1=0.9"), PSC_EINVAL);
    float rows[12];
    uint64_t k[4] = {5, 7, 5, UINT64_MAX};
    assert_int_equal(psc_table_pull(c, "nope", k, 4, rows), PSC_ENOTFOUND);
    assert_int_equal(psc_table_pull(c, "emb", k, 4, rows), 0);
    for (int i = 0; i < 12; i++)
        assert_true(rows[i] == 0.0f);
    const float g[9] = {1, 1, 1, 2, 2, 2, 3, 3, 3};
    assert_int_equal(psc_table_push(c, "emb", k, 3, g), 0); /* key 5 twice: 1 + 3 */
    uint64_t q[3] = {5, 7, 9};
    assert_int_equal(psc_table_pull(c, "emb", q, 3, rows), 0);
    for (int j = 0; j < 3; j++) {
        assert_true(rows[j] == -2.0f);
        assert_true(rows[3 + j] == -1.0f);
        assert_true(rows[6 + j] == 0.0f);
    }
    const float bad[3] = {1, NAN, 1};
    assert_int_equal(psc_table_push(c, "emb", q, 1, bad), PSC_ENONFINITE);
    /* the key named, whether the keys go as they are (distinct) or summed first;
     * nothing sent either way (key 9's row below is one push's) */
    const float bad3[9] = {1, 1, 1, 2, INFINITY, 2, 3, 3, 3};
    assert_int_equal(psc_table_push(c, "emb", q, 3, bad3), PSC_ENONFINITE);
    assert_non_null(strstr(psc_errmsg(c), "the gradient of key 7 is not finite"));
    const uint64_t twice[3] = {9, 7, 9};
    assert_int_equal(psc_table_push(c, "emb", twice, 3, bad3), PSC_ENONFINITE);
    assert_non_null(strstr(psc_errmsg(c), "the gradient of key 7 is not finite"));
    assert_int_equal(psc_table_pushpull(c, "emb", q + 2, 1, g, q, 3, rows), 0);
    assert_true(rows[0] == -2.0f && rows[6] == -0.5f);

    /* more keys than one message holds (65,536): split */
    enum { N = 70000 };
    uint64_t *kk = malloc(N * sizeof *kk);
    float *gg = malloc(N * 3 * sizeof *gg), *rr = malloc(N * 3 * sizeof *rr);
    assert_true(kk && gg && rr);
    for (size_t i = 0; i < N; i++) {
        kk[i] = 1000 + i * 0x9e3779b97f4a7c15ull;
        for (int j = 0; j < 3; j++)
            gg[3 * i + j] = (float)(i % 7);
    }
    assert_int_equal(psc_table_push(c, "emb", kk, N, gg), 0);
    assert_int_equal(psc_table_pull(c, "emb", kk, N, rr), 0);
    for (size_t i = 0; i < N; i++)
        assert_true(rr[3 * i + 2] == -0.5f * (float)(i % 7));

    /* psd restarted without its state: reconnected, the table declared again */
    psd_kill(&p);
    psd_start(&p, "asgd", 1, port, NULL);
    assert_int_equal(psc_table_pull(c, "emb", q, 3, rows), 0);
    for (int i = 0; i < 9; i++)
        assert_true(rows[i] == 0.0f);
    assert_int_equal(psc_reconnects(c), 1);
    assert_int_equal(psc_table_push(c, "emb", q, 1, g), 0);
    assert_int_equal(psc_table_pull(c, "emb", q, 1, rows), 0);
    assert_true(rows[0] == -0.5f);
    free(kk);
    free(gg);
    free(rr);
    psc_free(c);
    psd_kill(&p);
}

/* ---- signals and refusals ------------------------------------------------- */

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
}

/* on_signal for SIGUSR1, without SA_RESTART (as psworker and Python), the
 * handler before kept in old. */
static void catch_usr1(struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    assert_int_equal(sigaction(SIGUSR1, &sa, old), 0);
}

typedef struct {
    psc_client *c;
    pthread_t target;
    double sent_at;
    const char *then;  /* when set: once the signal was handled, shard 1 of
                        * psd `then` pushes, which closes the round */
    int then_rc;
} signal_arg;

/* Once c's step waits (psd said for whom), sends SIGUSR1 to the target
 * thread, as a terminal's Ctrl-C reaches a process's main thread. */
static void *signal_when_waiting(void *arg)
{
    signal_arg *sa = arg;
    char buf[256];
    for (double t0 = now_s(); now_s() - t0 < 10 && psc_waiting_for(sa->c, buf, sizeof buf) == 0;)
        usleep(10000);
    sa->sent_at = now_s();
    pthread_kill(sa->target, SIGUSR1);
    if (sa->then) {
        while (!got_signal && now_s() - sa->sent_at < 10)
            usleep(1000);
        psc_client *c = client(sa->then, "1/2");
        sa->then_rc = psc_connect(c);
        if (sa->then_rc == 0)
            sa->then_rc = psc_pushpull(c);
        psc_free(c);
    }
    return NULL;
}

/* With interrupt on, a signal handled while a BSP step waits for a shard
 * that never joins ends the step at once with PSC_EINTR; psc_leave then
 * says bye (psd frees the shard at once: another worker takes it). With
 * interrupt off (the default) the step waits on through the signal. */
static void test_interrupt(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "bsp", 2, 0, "heartbeat_timeout=300ms", "join_timeout=0", NULL);
    struct sigaction old;
    catch_usr1(&old);
    psc_client *a = client(p.addr, "0/2");
    assert_int_equal(psc_set(a, "interrupt", "maybe"), PSC_EINVAL);
    assert_int_equal(psc_set(a, "interrupt", "on"), 0);
    assert_int_equal(psc_connect(a), 0);
    signal_arg sg = {a, pthread_self(), 0, NULL, 0};
    pthread_t th;
    got_signal = 0;
    assert_int_equal(pthread_create(&th, NULL, signal_when_waiting, &sg), 0);
    assert_int_equal(psc_pushpull(a), PSC_EINTR);
    double took = now_s() - sg.sent_at;
    pthread_join(th, NULL);
    assert_int_equal(got_signal, SIGUSR1);
    assert_true(took < 1.0);
    assert_non_null(strstr(psc_errmsg(a), "interrupted by a signal"));
    assert_string_equal(psc_strerror(PSC_EINTR), "interrupted by a signal");
    double t0 = now_s();
    psc_leave(a, "stopped by SIGUSR1");
    assert_true(now_s() - t0 < 2.0);
    psc_free(a);
    /* the bye freed shard 0: a new worker takes it (a refusal would be at once) */
    psc_client *b = client(p.addr, "0/2");
    assert_int_equal(psc_connect(b), 0);
    /* interrupt off: the same signal does not end the wait; the round
     * closes when shard 1 pushes */
    signal_arg sg2 = {b, pthread_self(), 0, p.addr, -999};
    got_signal = 0;
    uint64_t v0 = psc_model_version(b);
    assert_int_equal(pthread_create(&th, NULL, signal_when_waiting, &sg2), 0);
    assert_int_equal(psc_pushpull(b), 0);
    pthread_join(th, NULL);
    assert_int_equal(got_signal, SIGUSR1);
    assert_int_equal(sg2.then_rc, 0);
    assert_int_equal(psc_model_version(b), v0 + 1);
    psc_free(b);
    sigaction(SIGUSR1, &old, NULL);
    psd_kill(&p);
}

/* psc_interrupt (what psworker's stop handler calls) before the step
 * begins to wait: a signal that came just before the wait would not end
 * it, and this BSP round never closes; the step ends at once with
 * PSC_EINTR, every call after it too, until psc_leave, which says bye. */
static void test_interrupt_before_the_wait(void **state)
{
    (void)state;
    psd_proc p = {0};
    psd_start(&p, "bsp", 2, 0, "heartbeat_timeout=300ms", "join_timeout=0", NULL);
    assert_int_equal(psc_interrupt(NULL), PSC_EINVAL);
    psc_client *a = client(p.addr, "0/2");
    assert_int_equal(psc_set(a, "interrupt", "on"), 0);
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_interrupt(a), 0);
    double t0 = now_s();
    assert_int_equal(psc_pushpull(a), PSC_EINTR);
    assert_int_equal(psc_pull(a), PSC_EINTR); /* the stop holds */
    assert_true(now_s() - t0 < 1.0);
    t0 = now_s();
    psc_leave(a, "stopped");
    assert_true(now_s() - t0 < 2.0);
    psc_free(a);
    /* the bye freed shard 0 */
    psc_client *b = client(p.addr, "0/2");
    assert_int_equal(psc_connect(b), 0);
    psc_free(b);
    psd_kill(&p);
}

typedef struct {
    pthread_t target;
    int ms;
} alarm_arg;

static void *signal_after(void *arg)
{
    alarm_arg *a = arg;
    usleep((useconds_t)a->ms * 1000);
    pthread_kill(a->target, SIGUSR1);
    return NULL;
}

/* A call other than a step interrupted while it waits for psd's reply
 * (psc_report to a psd held by SIGSTOP): the reply comes later on that
 * connection, and the next calls must not take it for theirs. The next
 * step opens the connection anew and works, and so does the next report.
 * (psworker's planned BSP loop met this: a stop signal during an epoch's
 * report, then one more step, which read the report's OK as its reply.) */
static void test_interrupted_report_then_step(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 1, 0, NULL);
    struct sigaction old;
    catch_usr1(&old);
    psc_client *a = client(p.addr, "0/1");
    assert_int_equal(psc_set(a, "interrupt", "on"), 0);
    assert_int_equal(psc_connect(a), 0);
    assert_int_equal(psc_pushpull(a), 0);
    uint64_t v1 = psc_model_version(a);
    assert_int_equal(kill(p.pid, SIGSTOP), 0);
    alarm_arg al = {pthread_self(), 300};
    pthread_t th;
    got_signal = 0;
    assert_int_equal(pthread_create(&th, NULL, signal_after, &al), 0);
    assert_int_equal(psc_report(a, 1, 0.5, -1, 0, 100, 1000.0), PSC_EINTR);
    pthread_join(th, NULL);
    assert_int_equal(got_signal, SIGUSR1);
    assert_int_equal(kill(p.pid, SIGCONT), 0);
    /* psd now answers the report on the old connection */
    int rc = psc_pushpull(a);
    if (rc != 0)
        fail_msg("the step after an interrupted report: %d (%s)", rc, psc_errmsg(a));
    assert_true(psc_model_version(a) > v1);
    assert_int_equal(psc_report(a, 1, 0.5, -1, 0, 100, 1000.0), 0);
    assert_int_equal(psc_pushpull(a), 0);
    psc_free(a);
    sigaction(SIGUSR1, &old, NULL);
    psd_kill(&p);
}

/* A step over a model split in two parts whose first-read part refuses
 * the push (a NaN gradient) while the wait on the other part's psd (held
 * by SIGSTOP) is interrupted: the step reports the refusal, and the
 * interrupted link, which still owes a reply, must not hand that reply to
 * the next step. The next steps open the links anew and work; the refused
 * part holds exactly the accepted pushes. A worker of shard 0 of 1 reads
 * part 1 first (the part after its shard's: first_part in client/step.c). */
static void test_interrupted_other_part(void **state)
{
    psd_proc p0 = {0}, p1 = {0};
    psd_start(&p0, "asgd", 1, 0, NULL);
    psd_start(&p1, "asgd", 1, 0, NULL);
    struct sigaction old;
    catch_usr1(&old);
    char servers[200];
    snprintf(servers, sizeof servers, "%s,%s", p0.addr, p1.addr);
    psc_client *c = split_client(servers, "0/1", 1);
    float *pc = psc_params(c), *gc = psc_grads(c);
    gc[4999] = NAN; /* in part 1 */
    assert_int_equal(kill(p0.pid, SIGSTOP), 0);
    alarm_arg al = {pthread_self(), 1000}; /* part 1 has answered by then, even under a loaded CI */
    pthread_t th;
    got_signal = 0;
    assert_int_equal(pthread_create(&th, NULL, signal_after, &al), 0);
    int rc = psc_pushpull(c);
    pthread_join(th, NULL);
    assert_int_equal(got_signal, SIGUSR1);
    if (rc == 0 || rc == PSC_EINTR)
        fail_msg("the step with part 1 refused and part 0's wait interrupted: %d (%s)", rc, psc_errmsg(c));
    if (!strstr(psc_errmsg(c), "[NONFINITE]"))
        fail_msg("the step reported %d (%s), not part 1's refusal", rc, psc_errmsg(c));
    assert_int_equal(kill(p0.pid, SIGCONT), 0); /* p0 answers the push on the old connection */
    gc[4999] = 2.0f;
    /* Each step's pull holds its own push: part 1 the first step's and
     * each one after (not the refused one's), part 0 the same and maybe
     * the interrupted step's (psd 0 read it after SIGCONT, unless the
     * worker's new connection came first). A client that kept the
     * interrupted link open (libpsclient did when the link was not the
     * one whose error the step reported) left part 0 a step behind in
     * three runs of seven. */
    float part0[2];
    for (int step = 0; step < 2; step++) {
        if ((rc = psc_pushpull(c)) != 0)
            fail_msg("step %d after the interrupted one: %d (%s)", step + 1, rc, psc_errmsg(c));
        part0[step] = pc[0];
        if (pc[4999] != 4999.0f - 2.0f - (float)step)
            fail_msg("step %d after the interrupted one: part 1 holds %g, not %g", step + 1, pc[4999],
                     4999.0f - 2.0f - (float)step);
    }
    if (!(part0[0] == -2.0f || part0[0] == -3.0f) || part0[1] != part0[0] - 1.0f)
        fail_msg("part 0 after the two steps: %g, %g (each step pushes once)", part0[0], part0[1]);
    psc_free(c);
    sigaction(SIGUSR1, &old, NULL);
    psd_kill(&p0);
    psd_kill(&p1);
}

/* spin_us: each wait for a reply polls the connection before it sleeps.
 * Table calls through the segment answer as without it. While a wait
 * polls, a signal still ends it with interrupt on: the spin blocks signals
 * and stops when one is pending, so that the sleep after it runs the
 * handler and ends; a handler run in the middle of the spin would leave
 * that sleep to go on until timeout_ms (with interrupt off, the spin leaves
 * signals alone). And timeout_ms still ends a wait that polls: a spin of
 * 1 s does not outlast a timeout of 0.3 s. */
static void test_spin(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, NULL);
    struct sigaction old;
    catch_usr1(&old);
    psc_client *c = client(p.addr, "0/2"), *d = client(p.addr, "1/2");
    assert_int_equal(psc_set(c, "spin_us", "1000001"), PSC_EINVAL);
    assert_int_equal(psc_set(c, "spin_us", "1000000"), 0);
    assert_int_equal(psc_set(c, "interrupt", "on"), 0);
    assert_int_equal(psc_set(c, "timeout_ms", "4000"), 0);
    assert_int_equal(psc_set(c, "reconnect_s", "1"), 0);
    assert_int_equal(psc_set(d, "spin_us", "1000000"), 0);
    assert_int_equal(psc_set(d, "timeout_ms", "300"), 0);
    assert_int_equal(psc_set(d, "reconnect", "off"), 0);
    assert_int_equal(psc_connect(c), 0);
    assert_int_equal(psc_connect(d), 0);
    assert_int_equal(psc_table(c, "emb", 4, "zeros", 0, 0, "sgd", "lr=0.5"), 0);
    assert_int_equal(psc_table(d, "emb", 4, "zeros", 0, 0, "sgd", "lr=0.5"), 0);
    uint64_t k[2] = {3, 4};
    const float g[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    float rows[8];
    assert_int_equal(psc_table_pushpull(c, "emb", k, 2, g, k, 2, rows), 0);
    for (int j = 0; j < 4; j++)
        assert_true(rows[j] == -0.5f && rows[4 + j] == -1.0f);
    assert_int_equal(kill(p.pid, SIGSTOP), 0);

    double t0 = now_s();
    int rc = psc_table_pull(d, "emb", k, 2, rows);
    double took = now_s() - t0;
    if (rc != PSC_ETIMEOUT || took > 0.9)
        fail_msg("a pull with timeout_ms 300 and spin_us 1 s from a stopped psd: %d after %.2f s (%s)", rc, took,
                 psc_errmsg(d));

    alarm_arg al = {pthread_self(), 200};
    pthread_t th;
    got_signal = 0;
    t0 = now_s();
    assert_int_equal(pthread_create(&th, NULL, signal_after, &al), 0);
    rc = psc_table_pull(c, "emb", k, 2, rows);
    took = now_s() - t0;
    pthread_join(th, NULL);
    assert_int_equal(got_signal, SIGUSR1);
    if (rc != PSC_EINTR || took > 0.9)
        fail_msg("a pull interrupted by a signal 0.2 s into its spin of 1 s: %d after %.2f s (%s)", rc, took,
                 psc_errmsg(c));
    assert_int_equal(kill(p.pid, SIGCONT), 0);
    assert_int_equal(psc_table_pull(c, "emb", k, 2, rows), 0); /* a new connection */
    for (int j = 0; j < 4; j++)
        assert_true(rows[j] == -0.5f && rows[4 + j] == -1.0f);
    psc_free(c);
    psc_free(d);
    sigaction(SIGUSR1, &old, NULL);
    psd_kill(&p);
}

/* A shard another worker holds is refused at once at psc_connect, not
 * retried for connect_s as if psd were down; the message says what to do. */
static void test_shard_taken_at_once(void **state)
{
    psd_proc p = {0};
    psd_start(&p, "asgd", 2, 0, NULL);
    psc_client *a = client(p.addr, "0/2"), *b = client(p.addr, "0/2");
    assert_int_equal(psc_set(b, "connect_s", "30"), 0);
    assert_int_equal(psc_connect(a), 0);
    double t0 = now_s();
    assert_int_equal(psc_connect(b), PSC_ESHARD);
    assert_true(now_s() - t0 < 2.0);
    assert_non_null(strstr(psc_errmsg(b), "shard 0 is already connected"));
    assert_non_null(strstr(psc_errmsg(b), "a shard of its own"));
    assert_null(strstr(psc_errmsg(b), "unreachable"));
    psc_free(a);
    psc_free(b);
    psd_kill(&p);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_client PSD_BINARY WORK_DIR\n");
        return 2;
    }
    psd_bin = argv[1];
    work_dir = argv[2];
    mkdir(work_dir, 0700);
    setenv("PSD_LOG_LEVEL", "error", 1);
    unsetenv("PSD_SERVER");
    unsetenv("PSD_TOKEN_FILE");
    signal(SIGPIPE, SIG_IGN);
    atexit(kill_started);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_and_pushpull), cmocka_unit_test(test_ranges_bind_wire),
        cmocka_unit_test(test_bsp_async),         cmocka_unit_test(test_split),
        cmocka_unit_test(test_wait_and_reconnect), cmocka_unit_test(test_limit_retried),
        cmocka_unit_test(test_chunk_options),     cmocka_unit_test(test_mistakes),
        cmocka_unit_test(test_plan),              cmocka_unit_test(test_waiting_for),
        cmocka_unit_test(test_tables),            cmocka_unit_test(test_hogwild),
        cmocka_unit_test(test_interrupt),         cmocka_unit_test(test_interrupt_before_the_wait),         cmocka_unit_test(test_shard_taken_at_once),
        cmocka_unit_test(test_interrupted_report_then_step), cmocka_unit_test(test_interrupted_other_part),
        cmocka_unit_test(test_spin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
