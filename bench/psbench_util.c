/* psbench_util.c - psbench's small helpers: clocks, dying with a message,
 * directories, what /proc says of a process (CPU, memory), and percentiles,
 * ranges and medians of samples. */
#include "psbench.h"

/* ---- small helpers ------------------------------------------------------- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psbench: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Directory of this executable (for the default --psd and mpi_allreduce). */
void exe_dir(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out, len, ".");
        return;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    if (strlen(self) >= len)
        snprintf(out, len, ".");
    else
        memcpy(out, self, strlen(self) + 1);
}

double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* A "VmHWM:" style line of /proc/PID/status, in MiB; -1 if unknown. */
double proc_status_mib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double v = -1;
    size_t kl = strlen(key);
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtod(line + kl + 1, NULL) / 1024.0; /* kB */
            break;
        }
    }
    fclose(f);
    return v;
}

/* CPU seconds (user + system) a process has used so far; -1 if unknown. */
double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return sorted[i < n ? i : n - 1];
}

/* The lowest and highest of v's n values but NaN (NaN when all are). */
void range_of(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = NAN;
    for (int i = 0; i < n; i++) {
        if (isnan(v[i]))
            continue;
        if (isnan(*lo) || v[i] < *lo)
            *lo = v[i];
        if (isnan(*hi) || v[i] > *hi)
            *hi = v[i];
    }
}

/* The median of v's n values but NaN (the mean of the middle two when
 * their count is even), NaN when all are. */
double median_of(const double *v, int n)
{
    double tmp[64];
    int k = 0;
    for (int i = 0; i < n && k < 64; i++)
        if (!isnan(v[i]))
            tmp[k++] = v[i];
    if (k == 0)
        return NAN;
    qsort(tmp, (size_t)k, sizeof *tmp, cmp_double);
    return k % 2 ? tmp[k / 2] : (tmp[k / 2 - 1] + tmp[k / 2]) / 2;
}
