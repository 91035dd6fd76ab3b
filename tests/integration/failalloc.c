/* failalloc.c - an LD_PRELOAD shim for test_nomem.py: psd runs out of
 * memory on demand. aligned_alloc, which psd calls for its parameter blocks
 * and for nothing else, fails while the file named by $PSD_FAILALLOC_FILE
 * exists, after as many successes as the number the file holds (none when
 * it holds none) counted from when the file appeared. Otherwise it is the
 * next aligned_alloc in the search order: glibc's, or AddressSanitizer's in
 * a sanitizer build (which then needs ASAN_OPTIONS=verify_asan_link_order=0).
 * psd allocates blocks on its loop thread only, so plain statics do. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *aligned_alloc(size_t align, size_t size)
{
    static void *(*next)(size_t, size_t);
    static int armed;        /* the trigger file was there at the last call */
    static long allow, used; /* successes it grants, and those given */
    if (!next)
        *(void **)&next = dlsym(RTLD_NEXT, "aligned_alloc"); /* POSIX's way to a function pointer */
    const char *trigger = getenv("PSD_FAILALLOC_FILE");
    FILE *f = trigger ? fopen(trigger, "r") : NULL;
    if (!f) {
        armed = 0;
        return next ? next(align, size) : NULL;
    }
    if (!armed) {
        armed = 1;
        used = 0;
        if (fscanf(f, "%ld", &allow) != 1)
            allow = 0;
    }
    fclose(f);
    if (used < allow) {
        used++;
        return next ? next(align, size) : NULL;
    }
    errno = ENOMEM;
    return NULL;
}
