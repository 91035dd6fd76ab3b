/* options.c - psworker's command line: its own flags (the data, the model,
 * the epochs) and, from libpsclient's table of options (psc_option), a flag
 * for each of the library's options that has one, with the library's help,
 * default and checks; then the libpsclient client configured from them. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/parse.h"
#include "proto/ps_limits.h"
#include "worker.h"

/* psworker's flags for libpsclient's options come from the library's table
 * (psc_option): each option with a flag is --FLAG here, its help and
 * default are the library's, and the value goes to psc_set unchanged. Only
 * what psworker does differently is here: */
static const struct {
    const char *name; /* the option (psc_set key) */
    char letter;      /* its short flag, 0: none */
    const char *dflt; /* psworker's default where it differs from the library's */
} lib_own[] = {
    {"server", 'S', NULL},
    {"shard", 'k', NULL},
    {"connect_s", 0, "10"}, /* a worker started with psd need not wait 30 s for it */
};

/* The index of option name in libpsclient's table, or -1. */
static int lib_index(const char *name)
{
    const psc_option_info *o;
    for (unsigned i = 0; (o = psc_option(i)) != NULL; i++)
        if (strcmp(o->name, name) == 0)
            return (int)i;
    return -1;
}

/* Writes text from column 26, wrapped before column 90. */
static void wrap(FILE *f, int col, const char *text)
{
    const int left = 26, width = 90;
    while (*text) {
        size_t n = strcspn(text, " ");
        if (col > left && col + 1 + (int)n > width) {
            fprintf(f, "\n%*s", left, "");
            col = left;
        } else if (col > left) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)n, text);
        col += (int)n;
        text += n;
        while (*text == ' ')
            text++;
    }
    fputc('\n', f);
}

/* The usage lines of the options libpsclient's table gives a flag. */
static void lib_usage(FILE *f)
{
    const psc_option_info *o;
    for (unsigned i = 0; (o = psc_option(i)) != NULL; i++) {
        if (!o->flag)
            continue;
        char letter = 0;
        const char *dflt = o->dflt;
        for (size_t k = 0; k < sizeof lib_own / sizeof lib_own[0]; k++)
            if (strcmp(lib_own[k].name, o->name) == 0) {
                letter = lib_own[k].letter;
                dflt = lib_own[k].dflt ? lib_own[k].dflt : dflt;
            }
        char head[80], text[1024];
        if (letter)
            snprintf(head, sizeof head, "  -%c, --%s %s", letter, o->flag, o->arg);
        else
            snprintf(head, sizeof head, "      --%s %s", o->flag, o->arg);
        fputs(head, f);
        int col = (int)strlen(head);
        if (col >= 25) {
            fprintf(f, "\n%26s", "");
            col = 26;
        } else {
            fprintf(f, "%*s", 26 - col, "");
            col = 26;
        }
        snprintf(text, sizeof text, "%s (default %s) [%s]", o->help, dflt, o->name);
        wrap(f, col, text);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psworker [options]\n"
            "\n"
            "Trains shard K of M of a data set against psd.\n"
            "\n"
            "Training:\n"
            "  -d, --dataset NAME      mnist or fashion-mnist (default mnist)\n"
            "  -D, --data DIR          data directory (default $PSD_DATA_DIR or ./data)\n"
            "  -M, --model SPEC        softmax, linear, mlp:H1,H2,... or cnn, with options after a\n"
            "                          colon: mlp:256,128:dropout=0.2, cnn:dropout=0.5,init=he\n"
            "                          (default mlp:256,128)\n"
            "  -e, --epochs N          epochs (default 5)\n"
            "  -b, --batch B           samples per step on this worker (default 64)\n"
            "  -E, --eval              test-set accuracy after every epoch\n"
            "      --limit N           use only the first N training samples\n"
            "      --test-limit N      use only the first N test samples\n"
            "      --seed S            seed for initial values and shuffling (default 1)\n"
            "      --threads T         OpenBLAS threads (default 1)\n"
            "  -q, --quiet             print only errors and the final JSON line\n"
            "      --epoch-json        also print one JSON line per epoch on stdout (epoch,\n"
            "                          train_seconds, wall_seconds, comm_wait_seconds: time spent\n"
            "                          waiting on psd, train_loss, test_accuracy, ...)\n"
            "      --no-shuffle        visit the shard in order every epoch (for reproducibility tests)\n"
            "      --fixed-shard       keep shard K of M for the whole run; by default, at the start of\n"
            "                          each epoch the workers that psd still counts share the data of\n"
            "                          those it declared lost (died and not back)\n"
            "      --no-plan           in bsp, count epochs and steps on this worker as psd version 1\n"
            "                          did; by default the workers propose psd a plan (the epochs,\n"
            "                          the training set's size, B x M samples a round, the seed) and\n"
            "                          psd tells each worker which samples to train every round, and\n"
            "                          when the job is done (see docs/running.md, \"A job by psd's plan\")\n"
            "      --save-params PATH  write the final parameters to PATH as raw little-endian float32\n"
            "      --pipeline on|off|auto  compute the next gradient while the last one travels\n"
            "                          (one step more staleness; default off); auto: on in asgd\n"
            "                          and ssp for models of at most 2^20 parameters on one psd,\n"
            "                          off in bsp\n"
            "      --lr R              in a job psd runs with local SGD (local_steps) or elastic\n"
            "                          averaging (elastic_alpha), the learning rate of psworker's\n"
            "                          own SGD, which trains its copy of the model between two\n"
            "                          exchanges with psd (default 0.1); unused otherwise\n"
            "      --momentum M        the same jobs: the momentum of psworker's own SGD (heavy ball,\n"
            "                          v = M v + g, w = w - lr v; v is the worker's own and\n"
            "                          outlives the exchanges) (default 0: plain SGD)\n"
            "      --snapshots N       time to accuracy: N times an epoch, at evenly spaced steps, keep\n"
            "                          a copy of the model in memory with the training time so far\n"
            "                          (local SGD: at the first round after the point, when the copy\n"
            "                          is the workers' mean); after the last epoch evaluate each on\n"
            "                          the test set and print one JSON line per copy (snapshot,\n"
            "                          epoch, step, samples, train_seconds, test_accuracy,\n"
            "                          test_loss); the clock runs only while training. Not in a\n"
            "                          job by psd's plan (add --no-plan in bsp)\n"
            "      --max-seconds S     stop training after S seconds of training time (at a step's\n"
            "                          end, as if the last epoch ended there; --snapshots then takes\n"
            "                          a last copy)\n"
            "  -V, --version           print the version\n"
            "  -h, --help              this help\n"
            "\n"
            "The connection to psd (libpsclient's options, its psc_set key in brackets):\n");
    lib_usage(f);
    fprintf(f,
            "\n"
            "Progress goes to stderr: a live bar with the rate and the time left when\n"
            "stderr is a terminal (with \"waiting N s for psd: round 3 waits for shard 2/3\n"
            "(never joined)\" while a step waits for psd longer than 2 s: a BSP round\n"
            "waiting for a worker, a pause; as psd tells it, or until it has, \"psctl\n"
            "status says for whom\"), one line per epoch otherwise. psd hears of it after\n"
            "every epoch and every $PSD_REPORT_INTERVAL seconds (default 1; 0: epochs only).\n"
            "\n"
            "Exit status: 0 when every epoch is done; 1 when training fails (psd\n"
            "unreachable past --reconnect-timeout, refused, missing data); 2 for a bad\n"
            "option; 143 (130) after SIGTERM (SIGINT): the worker finishes its step\n"
            "(a wait for psd ends at once), says bye to psd (which shows it as left,\n"
            "not lost) and exits.\n"
            "\n"
            "The last line on stdout is a JSON object: epochs, train_loss,\n"
            "test_accuracy (null without --eval), test_loss, seconds, samples,\n"
            "samples_per_second, version, mode, shard, model, reconnects,\n"
            "dropped_pushes, wire (the tensor type psd agreed to: f32 or bf16), shm\n"
            "(true when the last connection's pushes and pulls went through shared memory),\n"
            "hogwild (true when its steps went straight into psd's model: psd's hogwild = on).\n");
}

int pw_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psworker: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

int pw_options_parse(int argc, char **argv, wopts *o)
{
    *o = (wopts){.shard = 0, .nshards = 1, .dataset = "mnist", .model = "mlp:256,128", .epochs = 5, .batch = 64,
                 .seed = 1, .threads = 1, .pipeline = 0, .lr = 0.1};
    enum { O_LIMIT = 1000, O_TEST_LIMIT, O_SEED, O_THREADS, O_EPOCH_JSON, O_NO_SHUFFLE, O_FIXED_SHARD,
           O_SAVE_PARAMS, O_PIPELINE, O_NO_PLAN, O_LR, O_MOMENTUM, O_SNAPSHOTS, O_MAX_SECONDS, O_LIB /* O_LIB + i: libpsclient's option i */ };
    static const struct option own[] = {
        {"dataset", required_argument, NULL, 'd'}, {"data", required_argument, NULL, 'D'},
        {"model", required_argument, NULL, 'M'},   {"epochs", required_argument, NULL, 'e'},
        {"batch", required_argument, NULL, 'b'},   {"eval", no_argument, NULL, 'E'},
        {"limit", required_argument, NULL, O_LIMIT}, {"test-limit", required_argument, NULL, O_TEST_LIMIT},
        {"seed", required_argument, NULL, O_SEED}, {"threads", required_argument, NULL, O_THREADS},
        {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
        {"quiet", no_argument, NULL, 'q'},
        {"epoch-json", no_argument, NULL, O_EPOCH_JSON},
        {"no-shuffle", no_argument, NULL, O_NO_SHUFFLE},
        {"fixed-shard", no_argument, NULL, O_FIXED_SHARD},
        {"no-plan", no_argument, NULL, O_NO_PLAN},
        {"save-params", required_argument, NULL, O_SAVE_PARAMS},
        {"pipeline", required_argument, NULL, O_PIPELINE},
        {"lr", required_argument, NULL, O_LR},
        {"momentum", required_argument, NULL, O_MOMENTUM},
        {"snapshots", required_argument, NULL, O_SNAPSHOTS},
        {"max-seconds", required_argument, NULL, O_MAX_SECONDS},
    };
    const size_t nown = sizeof own / sizeof own[0];
    struct option longopts[sizeof own / sizeof own[0] + PW_LIB_OPTIONS_MAX + 1];
    memcpy(longopts, own, sizeof own);
    size_t n = nown;
    const psc_option_info *lo;
    for (unsigned i = 0; (lo = psc_option(i)) != NULL; i++) {
        if (i >= PW_LIB_OPTIONS_MAX)
            return pw_die("libpsclient has more than %d options; rebuild psworker against it", PW_LIB_OPTIONS_MAX);
        if (lo->flag)
            longopts[n++] = (struct option){lo->flag, required_argument, NULL, O_LIB + (int)i};
    }
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    /* psworker's own defaults of libpsclient's options */
    for (size_t k = 0; k < sizeof lib_own / sizeof lib_own[0]; k++)
        if (lib_own[k].dflt && lib_index(lib_own[k].name) >= 0)
            o->lib[lib_index(lib_own[k].name)] = lib_own[k].dflt;
    /* the token file from the environment is read at once, like --token-file
     * (libpsclient alone would read it at connect) */
    const char *token = getenv("PSD_TOKEN_FILE"), *server = getenv("PSD_SERVER");
    o->lib[lib_index("token_file")] = token && *token ? token : "";
    o->lib[lib_index("server")] = server && *server ? server : "127.0.0.1:7000"; /* as the library; for the log */
    ps_log_init("psworker", PS_LOG_INFO);
    o->data_dir = getenv("PSD_DATA_DIR") ? getenv("PSD_DATA_DIR") : "data";
    int opt;
    uint64_t v;
    while ((opt = getopt_long(argc, argv, "S:k:d:D:M:e:b:EqhV", longopts, NULL)) != -1) {
        if (opt == 'S' || opt == 'k')
            opt = O_LIB + lib_index(opt == 'S' ? "server" : "shard");
        if (opt >= O_LIB && opt < O_LIB + PW_LIB_OPTIONS_MAX) {
            o->lib[opt - O_LIB] = optarg;
            continue;
        }
        switch (opt) {
        case 'q': o->quiet = 1; break;
        case O_EPOCH_JSON: o->epoch_json = 1; break;
        case O_NO_SHUFFLE: o->no_shuffle = 1; break;
        case O_FIXED_SHARD: o->fixed_shard = 1; break;
        case O_NO_PLAN: o->no_plan = 1; break;
        case O_SAVE_PARAMS: o->save_params = optarg; break;
        case O_PIPELINE:
            if (strcmp(optarg, "on") == 0)
                o->pipeline = 1;
            else if (strcmp(optarg, "off") == 0)
                o->pipeline = 0;
            else if (strcmp(optarg, "auto") == 0)
                o->pipeline = -1;
            else
                return pw_die("bad --pipeline '%s': on, off or auto", optarg);
            break;
        case O_LR: {
            char *end;
            errno = 0;
            double lr = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(lr > 0 && lr <= 1000))
                return pw_die("bad --lr '%s': a number above 0, at most 1000", optarg);
            o->lr = lr;
            break;
        }
        case O_MOMENTUM: {
            char *end;
            errno = 0;
            double m = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(m >= 0 && m < 1))
                return pw_die("bad --momentum '%s': a number from 0 to below 1", optarg);
            o->momentum = m;
            break;
        }
        case O_SNAPSHOTS:
            if (ps_parse_u64(optarg, 1000, &v) || v == 0)
                return pw_die("bad --snapshots '%s': expected 1..1000 per epoch", optarg);
            o->snapshots = (int)v;
            break;
        case O_MAX_SECONDS: {
            char *end;
            errno = 0;
            double s = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(s > 0 && s <= 1e7))
                return pw_die("bad --max-seconds '%s': seconds above 0", optarg);
            o->max_seconds = s;
            break;
        }
        case 'd': o->dataset = optarg; break;
        case 'D': o->data_dir = optarg; break;
        case 'M': o->model = optarg; break;
        case 'e':
            if (ps_parse_u64(optarg, 100000, &v) || v == 0)
                return pw_die("bad --epochs '%s': expected 1..100000", optarg);
            o->epochs = (int)v;
            break;
        case 'b':
            if (ps_parse_u64(optarg, PS_MODEL_MAX_BATCH, &v) || v == 0)
                return pw_die("bad --batch '%s': expected 1..65536", optarg);
            o->batch = (int)v;
            break;
        case 'E': o->eval = 1; break;
        case O_LIMIT:
            if (ps_parse_u64(optarg, SIZE_MAX, &v))
                return pw_die("bad --limit '%s'", optarg);
            o->limit = (size_t)v;
            break;
        case O_TEST_LIMIT:
            if (ps_parse_u64(optarg, SIZE_MAX, &v))
                return pw_die("bad --test-limit '%s'", optarg);
            o->test_limit = (size_t)v;
            break;
        case O_SEED:
            if (ps_parse_u64(optarg, UINT64_MAX, &v))
                return pw_die("bad --seed '%s'", optarg);
            o->seed = v;
            break;
        case O_THREADS:
            if (ps_parse_u64(optarg, 256, &v) || v == 0)
                return pw_die("bad --threads '%s': expected 1..256", optarg);
            o->threads = (int)v;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("psworker %s (protocol %d)\n", PSD_VERSION, PS_PROTO_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc)
        return pw_die("unexpected argument '%s' (see psworker --help)", argv[optind]);
    return -1;
}

int pw_client_new(wopts *o, psc_client **out)
{
    psc_client *pc = psc_new();
    if (!pc)
        return pw_die("out of memory");
    const psc_option_info *lo;
    for (unsigned i = 0; (lo = psc_option(i)) != NULL && i < PW_LIB_OPTIONS_MAX; i++) {
        if (!o->lib[i] || psc_set(pc, lo->name, o->lib[i]) == 0)
            continue;
        /* the library's words with the flag for the key: "bad wire 'x': f32
         * or bf16" becomes "bad --wire 'x': ...", "shard auto: ..." "--shard auto: ..." */
        const char *msg = psc_errmsg(pc), *flag = lo->flag ? lo->flag : lo->name;
        size_t n = strlen(lo->name);
        if (strncmp(msg, "bad ", 4) == 0 && strncmp(msg + 4, lo->name, n) == 0 && msg[4 + n] == ' ')
            pw_die("bad --%s%s", flag, msg + 4 + n);
        else if (strncmp(msg, lo->name, n) == 0 && msg[n] == ' ')
            pw_die("--%s%s", flag, msg + n);
        else
            pw_die("%s", msg);
        psc_free(pc);
        return 2;
    }
    /* SIGTERM and SIGINT end a wait for psd at once (pw_stop says bye) */
    psc_set(pc, "interrupt", "on");
    uint32_t shard_k, shard_m;
    psc_shard(pc, &shard_k, &shard_m);
    o->shard = (int)shard_k;
    o->nshards = (int)shard_m;
    if (o->quiet) {
        ps_log_set_level(PS_LOG_ERROR);
        psc_set(pc, "log", "error");
    }
    *out = pc;
    return 0;
}

const char *pw_server(const wopts *o)
{
    return o->lib[lib_index("server")];
}
