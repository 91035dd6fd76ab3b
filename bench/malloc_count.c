/* malloc_count.c - an LD_PRELOAD shim that counts a process's heap
 * allocations, to see what psd allocates per message (bench/README.md).
 *
 *   LD_PRELOAD=build/bench/libmalloc_count.so psbench --no-mpi ...
 *
 * Every process started with it (psbench, and the psd it starts) writes one
 * line to stderr when it exits normally (psd: on SIGTERM, into its log):
 *   malloc_count: pid P (psd): malloc M calloc C realloc R aligned A free F;
 *   N allocations of >= 1 MiB, B MiB in them
 * Run the same cell with two --rounds values and subtract to get the count
 * per round trip. The shim forwards to glibc's __libc_* functions, so it
 * needs no dlsym (which itself allocates). Counting uses relaxed atomics:
 * cheap, and right with threads. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BIG (1u << 20)

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static atomic_ulong n_malloc, n_calloc, n_realloc, n_aligned, n_free, n_big, big_bytes;

static void count_big(size_t n)
{
    if (n >= BIG) {
        atomic_fetch_add_explicit(&n_big, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&big_bytes, n, memory_order_relaxed);
    }
}

void *malloc(size_t n)
{
    atomic_fetch_add_explicit(&n_malloc, 1, memory_order_relaxed);
    count_big(n);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    atomic_fetch_add_explicit(&n_calloc, 1, memory_order_relaxed);
    if (m == 0 || n <= (size_t)-1 / m)
        count_big(n * m);
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    atomic_fetch_add_explicit(&n_realloc, 1, memory_order_relaxed);
    count_big(n);
    return __libc_realloc(p, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    atomic_fetch_add_explicit(&n_aligned, 1, memory_order_relaxed);
    count_big(n);
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
    atomic_fetch_add_explicit(&n_aligned, 1, memory_order_relaxed);
    count_big(n);
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    atomic_fetch_add_explicit(&n_aligned, 1, memory_order_relaxed);
    count_big(n);
    void *p = __libc_memalign(align, n);
    if (!p && n)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

void free(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&n_free, 1, memory_order_relaxed);
    __libc_free(p);
}

__attribute__((destructor)) static void report(void)
{
    char comm[64] = "?", line[512];
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    int len = snprintf(line, sizeof line,
                       "malloc_count: pid %d (%s): malloc %lu calloc %lu realloc %lu aligned %lu free %lu; "
                       "%lu allocations of >= 1 MiB, %.1f MiB in them\n",
                       (int)getpid(), comm, atomic_load(&n_malloc), atomic_load(&n_calloc), atomic_load(&n_realloc),
                       atomic_load(&n_aligned), atomic_load(&n_free), atomic_load(&n_big),
                       (double)atomic_load(&big_bytes) / 1048576.0);
    if (len > 0 && write(2, line, (size_t)len) < 0)
        return;
}
