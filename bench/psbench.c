/* psbench.c - how close psd's push and pull come to the wire.
 *
 * For each (mode, S, K) cell psbench starts a fresh psd as a child process
 * (127.0.0.1, port 0, --port-file), connects K simulated workers (threads,
 * one libpsclient client each, through the public API of
 * include/psd/client.h only: shards 0..K-1 of K with a layout of one
 * tensor "w" of S floats; the first worker's values become the model),
 * and then times round trips: push S floats + pull S floats with
 * psc_pushpull, as psworker does: one PUSHPULL for S <= 2^20, otherwise
 * PUSH chunks of 2^20 floats (fin on the last) sent back to back, then PULL
 * chunks with 2 requests in flight (the library's defaults). With --wire
 * bf16 the workers ask for bfloat16 tensors, as psworker --wire bf16 does:
 * psd must offer them in its welcome, and then pushes and pulls carry 2
 * bytes a value instead of 4 (the client library converts).
 *
 * Next to it, and with the same K client threads, it times the same bytes
 * over plain TCP: a one-thread epoll server (a child process, like psd) that
 * reads S values from each client and writes S values back (4 bytes each,
 * 2 with --wire bf16), with no framing, no msgpack, no conversion and no
 * optimizer. That is the ceiling psd is compared with.
 *
 * It prints and writes (CSV, gnuplot PNG) per cell: payload GB/s (tensor
 * bytes pushed + pulled per second as sent on the wire, all workers
 * together), round trips/s, p50 and p99 round-trip latency, the CPU psd
 * used, psd's peak RSS (VmHWM) against the memory bound of the issue, the
 * ratio psd/ceiling, and how long psd took to answer a probe's heartbeats
 * meanwhile (its loop's stalls). --chunk and --pull-window (the library's
 * options chunk and pull_window) depart from psworker's behaviour, to
 * measure what a change of the worker would gain. When
 * bench/mpi_allreduce was built (Open MPI found), it also times
 * MPI_Allreduce of S floats on 2 ranks over TCP and shared memory (float32
 * whatever --wire says: MPI has no bfloat16 sum) and sets BSP rounds of 2
 * workers beside it: with one psd, and with the model split over 2 psd
 * instances (the library's split), each worker reaching them through
 * shared memory (libpsclient offers its segment to every psd of the
 * list, so on this one machine both parts go through it).
 *
 * --table times rows by key instead (psc_table_pushpull through an
 * embedding table, against the plain-TCP ceiling of the same bytes), and
 * --ckpt-stall G the checkpoint stall: psd with a state dir, a table of G GB
 * filled by pushes, then pull latency (p50, p99, max) of K workers without a
 * checkpoint and while psctl checkpoint runs (psd forks; its writer writes
 * the file), with the checkpoint's time and file and psd's memory (the
 * file psbench_ckpt.c).
 *
 * A benchmark, not a test: it reports figures and fails only when it cannot
 * measure. See bench/README.md.
 *
 * This file holds the options and main(); each mode has a file of its
 * own (psbench.h says which). */
#include "psbench.h"

const char *const mode_names[MODE_COUNT] = {"asgd", "bsp", "bsp-arrival"};

/* ---- options --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psbench [options]\n"
            "Times push+pull round trips of a dense model between K simulated workers and a real\n"
            "psd, and the same bytes over plain TCP, and prints payload GB/s (tensor bytes as\n"
            "sent on the wire), round trips/s, p50/p99 latency and psd's peak RSS per (mode,\n"
            "model size, workers). --table and --ckpt-stall are modes of their own (below).\n\n"
            "  --psd PATH        psd to run (default: ../server/psd next to psbench)\n"
            "  --sizes LIST      model sizes in floats, comma-separated; k, M suffixes\n"
            "                    (default 235146,1M,10M,100M)\n"
            "  --workers LIST    simulated workers K (default 1,2,4,8)\n"
            "  --modes LIST      asgd, bsp (shard-order sums, psd's default), bsp-arrival\n"
            "                    (default asgd,bsp,bsp-arrival)\n"
            "  --seconds T       timed part of each cell (default 2); a cell runs at least one\n"
            "                    round trip per worker however long it takes\n"
            "  --rounds N        stop each worker after N timed round trips (default: no limit)\n"
            "  --warmup N        untimed round trips per worker first (default 1)\n"
            "  --out DIR         psbench.csv, mpi.csv, the plot and psd logs (default bench/out)\n"
            "  --chunk N         floats per frame (default 1048576 = 2^20, psworker's); a model of\n"
            "                    at most N floats travels as one PUSHPULL\n"
            "  --pull-window N   chunk pulls in flight (default 2, psworker's); 0: every chunk\n"
            "                    request, push or pull, waits for its reply\n"
            "  --wire f32|bf16   tensors on psd's wire (default f32); bf16: the workers ask for\n"
            "                    bfloat16 as psworker --wire bf16 does (psd must offer it, else\n"
            "                    psbench fails), GB/s counts 2 bytes a value and the plain-TCP\n"
            "                    ceiling moves 2 bytes a value too; MPI_Allreduce stays float32\n"
            "  --no-tcp          skip the plain-TCP ceiling\n"
            "  --no-mpi          skip the MPI_Allreduce comparison\n"
            "  --round-reps N    after the grid, BSP rounds of 2 workers (one psd; in float32 up\n"
            "                    to 2^21 floats also the model in 2 parts on 2 psd), the star\n"
            "                    round and MPI_Allreduce are measured back to back N times per size\n"
            "                    (default 3; 0 skips it)\n"
            "  --no-plot         write the gnuplot script but do not run gnuplot\n"
            "  --no-probe        do not measure psd's loop lag (an admin connection sending\n"
            "                    a heartbeat every 10 ms during each psd cell)\n"
            "  --table           the table mode instead of the dense grid: rows per second of\n"
            "                    push-and-pull by key (psc_table_pushpull) through an embedding\n"
            "                    table in psd (asgd) against the plain-TCP ceiling of the same\n"
            "                    request and answer bytes, and per psd core; K from --workers\n"
            "                    (default 2); writes table.csv; exits 1 if a cell failed\n"
            "  --server-cpu C    every server psbench starts (psd, the plain-TCP server) runs on\n"
            "                    CPU C alone, psbench's workers on the other CPUs: machines whose\n"
            "                    CPUs differ in speed compare psd and the ceiling on the same one\n"
            "  --table-reps N    table: per K, N pairs of cells, the ceiling then psd, one after\n"
            "                    the other (default 3), so that both sides of each ratio meet the\n"
            "                    same machine; a line per pair, then each figure's median over\n"
            "                    the N pairs and its range (table.csv: a row per pair, `rep`)\n"
            "  --client-spin US  each worker's wait for a reply polls its socket for up to US\n"
            "                    microseconds, yielding the CPU between polls, before it sleeps:\n"
            "                    psd's workers through libpsclient's spin_us, the plain-TCP\n"
            "                    ceiling's clients likewise (default 0: they sleep at once)\n"
            "  --replica         each psd cell's psd gets a follower (psd --replica-of, replication\n"
            "                    sync): the timed part starts once it is in sync, so every push waits\n"
            "                    for it; compare with the same run without --replica\n"
            "  --replica-pairs N N pairs of cells, psd without a follower then with one (sync), one\n"
            "                    after the other in this one run: each pair's ratio (with/without)\n"
            "                    and their median and range, for the table cell (--table) or the\n"
            "                    dense cells (each size and worker count of the first --modes);\n"
            "                    replaces the plain-TCP ceiling; writes replica_pairs.csv\n"
            "  --follower-cpu C  --replica's follower runs on CPU C alone, and everything else\n"
            "                    psbench starts (psd, the workers) on the other CPUs, with\n"
            "                    --replica or without: the follower as on a machine of its own,\n"
            "                    and both runs on the same CPUs otherwise\n"
            "  --table-tcp       the table mode's workers send their requests to psd in frames\n"
            "                    over loopback TCP (libpsclient's shm off), not through their\n"
            "                    table segments\n"
            "  --psd-set K=V     a setting for every psd psbench starts (psd --set K=V, after\n"
            "                    psbench's own), e.g. table_apply=hogwild; up to 16\n"
            "  --ckpt-stall G    the checkpoint stall instead of the grid: fill a table of G GB\n"
            "                    (10^9 bytes of keys, rows and AdaGrad state; dim 128) in one\n"
            "                    psd with a state dir (OUT/ckpt-state), then K workers pull --keys\n"
            "                    random stored keys a request (default 256) back to back for\n"
            "                    --seconds (default 5) without a checkpoint, and on while psctl\n"
            "                    checkpoint runs: p50, p99, max, requests/s of both, the\n"
            "                    checkpoint's time and file, psd's memory; writes ckpt_stall.csv;\n"
            "                    exits 1 if it could not measure (see bench/README.md)\n"
            "  --ckpt-push       with --ckpt-stall: push-and-pulls (psc_table_pushpull) too:\n"
            "                    without a checkpoint, during a second one, and after it\n"
            "  --psctl PATH      with --ckpt-stall: psctl to run (default: next to psd, or the\n"
            "                    build tree's psctl/psctl)\n"
            "  --dim N           table: values per row (default 16; --ckpt-stall: 128)\n"
            "  --keys N          table: distinct keys a request pushes and pulls (default 4096;\n"
            "                    --ckpt-stall: keys a request pulls, 256)\n"
            "  --key-space N     table: keys drawn from N distinct ones (default 1M)\n"
            "  --zipf S          table: Zipf exponent of the keys' ranks (default 1.1); 0: uniform\n"
            "  -v, --verbose     psd logs at info level; print server pids\n"
            "  -h, --help        this help\n\n"
            "PSBENCH_SHOW_PID=1 prints each server's pid (to attach perf).\n");
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s)
        die("bad size '%s'", s);
    if (*end == 'k' || *end == 'K')
        v *= 1e3, end++;
    else if (*end == 'm' || *end == 'M')
        v *= 1e6, end++;
    else if (*end == 'g' || *end == 'G')
        v *= 1e9, end++;
    if (*end || v < 1 || v > 4294967295.0)
        die("bad size '%s' (floats, 1 .. 2^32-1)", s);
    return (uint64_t)v;
}

static int split(const char *arg, char items[][32], int max)
{
    int n = 0;
    const char *p = arg;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (n == max)
            die("too many items in '%s' (at most %d)", arg, max);
        if (l == 0 || l >= 32)
            die("bad list '%s'", arg);
        memcpy(items[n], p, l);
        items[n][l] = 0;
        n++;
        p += l;
        if (*p == ',')
            p++;
    }
    return n;
}

static void parse_opts(int argc, char **argv, opts *o)
{
    char items[MAX_LIST][32], dir[PATH_MAX - 64];
    memset(o, 0, sizeof *o);
    exe_dir(dir, sizeof dir);
    snprintf(o->psd, sizeof o->psd, "%s/../server/psd", dir);
    snprintf(o->mpi_prog, sizeof o->mpi_prog, "%s/mpi_allreduce", dir);
    const uint64_t dsizes[] = {235146, 1000000, 10000000, 100000000};
    const int dworkers[] = {1, 2, 4, 8};
    memcpy(o->sizes, dsizes, sizeof dsizes);
    o->nsizes = 4;
    memcpy(o->workers, dworkers, sizeof dworkers);
    o->nworkers = 4;
    for (int m = 0; m < MODE_COUNT; m++)
        o->modes[m] = m;
    o->nmodes = MODE_COUNT;
    o->seconds = 2;
    o->round_reps = 3;
    o->table_reps = 3;
    o->warmup = 1;
    o->chunk = CHUNK_FLOATS;
    o->window = PULL_WINDOW;
    o->probe = 1;
    o->wire = WIRE_F32;
    o->out = "bench/out";
    o->dim = 16;
    o->nkeys = 4096;
    o->key_space = 1000000;
    o->zipf = 1.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                         \
    do {                                                \
        if (!v)                                         \
            die("%s needs a value (see --help)", a);    \
        i++;                                            \
    } while (0)
        if (strcmp(a, "--psd") == 0) {
            NEEDV();
            snprintf(o->psd, sizeof o->psd, "%s", v);
        } else if (strcmp(a, "--sizes") == 0) {
            NEEDV();
            o->nsizes = split(v, items, MAX_LIST);
            for (int k = 0; k < o->nsizes; k++)
                o->sizes[k] = parse_size(items[k]);
        } else if (strcmp(a, "--workers") == 0) {
            NEEDV();
            o->workers_given = 1;
            o->nworkers = split(v, items, MAX_LIST);
            for (int k = 0; k < o->nworkers; k++) {
                char *end;
                long n = strtol(items[k], &end, 10);
                if (*end || n < 1 || n > 256)
                    die("bad worker count '%s' (1..256)", items[k]);
                o->workers[k] = (int)n;
            }
        } else if (strcmp(a, "--modes") == 0) {
            NEEDV();
            int n = split(v, items, MAX_LIST);
            o->nmodes = 0;
            for (int k = 0; k < n; k++) {
                int m = 0;
                while (m < MODE_COUNT && strcmp(items[k], mode_names[m]) != 0)
                    m++;
                if (m == MODE_COUNT)
                    die("unknown mode '%s' (asgd, bsp, bsp-arrival)", items[k]);
                if (o->nmodes == MODE_COUNT)
                    die("a mode named twice in '%s'", v);
                o->modes[o->nmodes++] = m;
            }
        } else if (strcmp(a, "--seconds") == 0) {
            NEEDV();
            o->seconds = atof(v);
            if (!(o->seconds > 0 && o->seconds <= 3600))
                die("bad --seconds '%s' (0 .. 3600)", v);
            o->seconds_given = 1;
        } else if (strcmp(a, "--round-reps") == 0) {
            NEEDV();
            o->round_reps = atoi(v);
            if (o->round_reps < 0 || o->round_reps > 64)
                die("bad --round-reps '%s' (0..64)", v);
        } else if (strcmp(a, "--server-cpu") == 0 || strcmp(a, "--follower-cpu") == 0) {
            NEEDV();
            char *end;
            long c = strtol(v, &end, 10);
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            if (*end || c < 0 || c >= n || n < 2)
                die("bad %s '%s' (0..%ld, and at least 2 CPUs)", a, v, n - 1);
            *(a[2] == 's' ? &server_cpu : &follower_cpu) = (int)c;
        } else if (strcmp(a, "--table-reps") == 0) {
            NEEDV();
            o->table_reps = atoi(v);
            if (o->table_reps < 1 || o->table_reps > 64)
                die("bad --table-reps '%s' (1..64)", v);
        } else if (strcmp(a, "--rounds") == 0) {
            NEEDV();
            o->max_rounds = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--warmup") == 0) {
            NEEDV();
            o->warmup = atoi(v);
            if (o->warmup < 0)
                die("bad --warmup '%s'", v);
        } else if (strcmp(a, "--chunk") == 0) {
            NEEDV();
            o->chunk = parse_size(v);
            if (o->chunk < 1024 || o->chunk > (1u << 24))
                die("bad --chunk '%s' (1k to 16M floats: the library's bounds; psd's max_frame is set to 64M)", v);
        } else if (strcmp(a, "--pull-window") == 0) {
            NEEDV();
            o->window = atoi(v);
            if (o->window < 0 || o->window > 64)
                die("bad --pull-window '%s' (0..64)", v);
        } else if (strcmp(a, "--wire") == 0) {
            NEEDV();
            if (strcmp(v, "f32") == 0)
                o->wire = WIRE_F32;
            else if (strcmp(v, "bf16") == 0)
                o->wire = WIRE_BF16;
            else
                die("bad --wire '%s' (f32 or bf16)", v);
        } else if (strcmp(a, "--out") == 0) {
            NEEDV();
            o->out = v;
        } else if (strcmp(a, "--psd-set") == 0) {
            NEEDV();
            if (!strchr(v, '=') || o->npsd_set >= 16)
                die("bad --psd-set '%s' (KEY=VALUE, a psd setting; at most 16)", v);
            o->psd_set[o->npsd_set++] = v;
        } else if (strcmp(a, "--table") == 0) {
            o->table = 1;
        } else if (strcmp(a, "--ckpt-stall") == 0) {
            NEEDV();
            char *end;
            o->ckpt_gb = strtod(v, &end);
            if (*end || !(o->ckpt_gb > 0 && o->ckpt_gb <= 1024))
                die("bad --ckpt-stall '%s' (GB of table rows, above 0 and at most 1024)", v);
        } else if (strcmp(a, "--ckpt-push") == 0) {
            o->ckpt_push = 1;
        } else if (strcmp(a, "--psctl") == 0) {
            NEEDV();
            snprintf(o->psctl, sizeof o->psctl, "%s", v);
        } else if (strcmp(a, "--dim") == 0) {
            NEEDV();
            char *end;
            unsigned long d = strtoul(v, &end, 10);
            if (*end || d < 1 || d > 1024)
                die("bad --dim '%s' (1..1024, a table's row)", v);
            o->dim = (uint32_t)d;
            o->dim_given = 1;
        } else if (strcmp(a, "--keys") == 0) {
            NEEDV();
            uint64_t k = parse_size(v);
            if (k > 65536)
                die("bad --keys '%s' (1..65536: one table message)", v);
            o->nkeys = (uint32_t)k;
            o->keys_given = 1;
        } else if (strcmp(a, "--key-space") == 0) {
            NEEDV();
            o->key_space = parse_size(v);
            if (o->key_space > 100000000)
                die("bad --key-space '%s' (at most 100M)", v);
        } else if (strcmp(a, "--zipf") == 0) {
            NEEDV();
            char *end;
            o->zipf = strtod(v, &end);
            if (*end || !(o->zipf >= 0 && o->zipf <= 5))
                die("bad --zipf '%s' (0..5; 0: uniform)", v);
        } else if (strcmp(a, "--no-tcp") == 0) {
            o->no_tcp = 1;
        } else if (strcmp(a, "--replica") == 0) {
            o->replica = 1;
        } else if (strcmp(a, "--replica-pairs") == 0) {
            NEEDV();
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 64)
                die("bad --replica-pairs '%s' (1..64)", v);
            o->replica_pairs = (int)n;
        } else if (strcmp(a, "--table-tcp") == 0) {
            o->table_tcp = 1;
        } else if (strcmp(a, "--client-spin") == 0) {
            NEEDV();
            char *end;
            long us = strtol(v, &end, 10);
            if (*end || us < 0 || us > 1000000)
                die("bad --client-spin '%s' (0..1000000 microseconds)", v);
            o->client_spin = (int)us;
        } else if (strcmp(a, "--no-mpi") == 0) {
            o->no_mpi = 1;
        } else if (strcmp(a, "--no-probe") == 0) {
            o->probe = 0;
        } else if (strcmp(a, "--no-plot") == 0) {
            o->no_plot = 1;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->verbose = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            usage(stderr);
            die("unknown option '%s'", a);
        }
#undef NEEDV
    }
    if (access(o->psd, X_OK) != 0)
        die("no psd at %s (build it, or give --psd PATH)", o->psd);
    if (server_cpu >= 0 && follower_cpu >= 0)
        die("--server-cpu and --follower-cpu: one or the other");
    if (server_cpu >= 0)
        pin_self(-server_cpu - 1); /* the workers (and psctl, mpirun) on the other CPUs */
    if (follower_cpu >= 0)
        pin_self(-follower_cpu - 1); /* all but the follower (follower_start) */
    if (o->ckpt_gb > 0) {
        if (o->table)
            die("--ckpt-stall is a mode of its own: not with --table");
        if (!o->dim_given)
            o->dim = 128;
        if (!o->keys_given)
            o->nkeys = 256;
        if (!o->seconds_given)
            o->seconds = 5;
        if (!o->workers_given)
            o->workers[0] = 2, o->nworkers = 1;
        if (o->nworkers != 1)
            die("--ckpt-stall takes one worker count (--workers K)");
        if ((uint64_t)o->nkeys * o->dim > ((uint64_t)1 << 22))
            die("--keys x --dim over 2^22 values: more than one table message");
        if (!o->psctl[0]) { /* beside psd (installed), or in the build tree's psctl/ */
            char d[PATH_MAX - 32];
            snprintf(d, sizeof d, "%.4000s", o->psd);
            char *slash = strrchr(d, '/');
            if (slash)
                *slash = 0;
            else
                snprintf(d, sizeof d, ".");
            snprintf(o->psctl, sizeof o->psctl, "%s/psctl", d);
            if (access(o->psctl, X_OK) != 0)
                snprintf(o->psctl, sizeof o->psctl, "%s/../psctl/psctl", d);
        }
        if (access(o->psctl, X_OK) != 0)
            die("no psctl at %s (build it, or give --psctl PATH): --ckpt-stall asks psd for the checkpoint with it",
                o->psctl);
    } else if (o->ckpt_push) {
        die("--ckpt-push goes with --ckpt-stall G");
    }
    if (o->table && !o->workers_given) {
        o->workers[0] = 2;
        o->nworkers = 1;
    }
    if (o->table && (uint64_t)o->nkeys * o->dim > ((uint64_t)1 << 22))
        die("--keys x --dim over 2^22 values: more than one table message");
    if (o->table && o->key_space < 2 * (uint64_t)o->nkeys)
        die("--key-space must be at least twice --keys (each batch holds distinct keys)");
    if (access(o->mpi_prog, X_OK) != 0)
        o->mpi_prog[0] = 0;
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    opts o;
    parse_opts(argc, argv, &o);
    signal(SIGPIPE, SIG_IGN);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/logs", o.out);
    if (mkdir_p(path) != 0)
        die("cannot create %s: %s", path, strerror(errno));
    if (o.replica_pairs) {
        run_replica_pairs(&o);
        return 0;
    }
    if (o.table) {
        run_tables(&o);
        return 0;
    }
    if (o.ckpt_gb > 0) {
        run_ckpt_stall(&o);
        return 0;
    }
    snprintf(path, sizeof path, "%s/psbench.csv", o.out);
    FILE *csv = fopen(path, "w");
    if (!csv)
        die("cannot write %s: %s", path, strerror(errno));
    csv_header(csv);

    uint64_t smax = 0;
    for (int i = 0; i < o.nsizes; i++)
        smax = o.sizes[i] > smax ? o.sizes[i] : smax;
    float *grad = malloc(smax * sizeof(float));
    if (!grad)
        die("out of memory for %" PRIu64 " floats", smax);
    for (uint64_t i = 0; i < smax; i++) /* small, finite, not all equal */
        grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);

    size_t vb = wire_size(o.wire);
    printf("psbench: psd %s, %ld CPUs, %.1f s per cell, warm-up %d, chunks of %" PRIu64 " floats%s, wire %s\n",
           o.psd, sysconf(_SC_NPROCESSORS_ONLN), o.seconds, o.warmup, o.chunk,
           o.window == PULL_WINDOW ? " (as psworker)" : ", another pull window than psworker's",
           wire_name(o.wire));
    printf("GB/s: tensor bytes pushed + pulled as sent on the wire (%s: 2 x S x %zu per round trip) per second,\n"
           "all workers together; the plain-TCP ceiling moves the same bytes (S x %zu each way%s);\n"
           "cpu: psd's CPU seconds per second; peak: psd's VmHWM (! over the bound); lag: how long psd took\n"
           "to answer an admin heartbeat sent every 10 ms (its loop busy elsewhere); load: 1-min load average\n",
           wire_name(o.wire), vb, vb,
           o.wire == WIRE_F32 ? "" : ", no conversion");
    if (o.client_spin)
        printf("every worker polls up to %d us for each reply before it sleeps (--client-spin)\n", o.client_spin);
    print_header(o.wire);
    int ncells = o.nsizes * o.nworkers;
    row *rows = calloc((size_t)ncells * (size_t)o.nmodes, sizeof *rows);
    row *tcp = calloc((size_t)ncells, sizeof *tcp);
    if (!rows || !tcp)
        die("out of memory");
    int nrows = 0, ntcp = 0;
    double t_all = now_s();
    for (int si = 0; si < o.nsizes; si++) {
        for (int wi = 0; wi < o.nworkers; wi++) {
            uint64_t S = o.sizes[si];
            int K = o.workers[wi];
            row *t = NULL;
            if (!o.no_tcp) {
                t = &tcp[ntcp++];
                run_cell(&o, SYS_TCP, MODE_ASGD, S, K, grad, 0, t);
            }
            for (int mi = 0; mi < o.nmodes; mi++) {
                row *p = &rows[nrows++];
                run_cell(&o, SYS_PSD, o.modes[mi], S, K, grad, 0, p);
                print_row(p, t);
                csv_row(csv, p, t);
                if (p->r.wire_refused)
                    die("--wire %s: %s", wire_name(o.wire), p->r.err);
            }
        }
    }
    fclose(csv);
    printf("\n%d cells in %.0f s; CSV: %s/psbench.csv, psd logs: %s/logs/\n", nrows + ntcp, now_s() - t_all, o.out,
           o.out);

    /* BSP rounds of 2 workers against the least any central server does
     * for one (the plain-TCP star round) and against MPI_Allreduce */
    int have_bsp = 0, have_k2 = 0;
    for (int mi = 0; mi < o.nmodes; mi++)
        have_bsp |= o.modes[mi] != MODE_ASGD;
    for (int wi = 0; wi < o.nworkers; wi++)
        have_k2 |= o.workers[wi] == 2;
    if (have_bsp && have_k2 && o.round_reps > 0)
        compare_rounds(&o, grad);
    free(grad);
    plot(&o, rows, nrows, tcp, ntcp);
    free(rows);
    free(tcp);
    return 0;
}
