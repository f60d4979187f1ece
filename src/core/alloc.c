/* Counting allocator. Each block carries a 64-byte header holding its
 * size and pool so osp_free can decrement the right counter; the user
 * pointer stays 64-byte aligned. Page blocks (osp_pages_*) have none: each
 * is a mapping of its own, freed with its size. */
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "core.h"

int osp_log_level = 1;

#define HDR 64
static _Atomic size_t pool_bytes[OSP_POOL_COUNT];

void *osp_malloc(osp_pool pool, size_t n) {
    if (pool >= OSP_POOL_COUNT || n > SIZE_MAX - HDR) return NULL;
    void *raw = NULL;
    /* at least one byte past the header, so that even a zero-size block's
     * pointer points into its allocation (leak checkers see it as held) */
    if (posix_memalign(&raw, 64, (n ? n : 1) + HDR) != 0) return NULL;
    size_t *h = raw;
    h[0] = n;
    h[1] = (size_t)pool;
    h[2] = 0; /* from posix_memalign */
    atomic_fetch_add(&pool_bytes[pool], n);
    return (char *)raw + HDR;
}

#define HUGE_ALIGN ((size_t)2 << 20)

void *osp_malloc_huge(osp_pool pool, size_t n) {
    if (pool >= OSP_POOL_COUNT || n > SIZE_MAX - 2 * HUGE_ALIGN) return NULL;
    size_t len = n + 2 * HUGE_ALIGN;
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    char *user = (char *)(((uintptr_t)base + HDR + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
#ifdef MADV_HUGEPAGE
    madvise(user, (n + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1), MADV_HUGEPAGE); /* advice only: fine if refused */
#endif
    size_t *h = (size_t *)(user - HDR);
    h[0] = n;
    h[1] = (size_t)pool;
    h[2] = 1; /* from mmap */
    h[3] = (size_t)(uintptr_t)base;
    h[4] = len;
    atomic_fetch_add(&pool_bytes[pool], n);
    return user;
}

void *osp_calloc(osp_pool pool, size_t n) {
    void *p = osp_malloc(pool, n);
    if (p) memset(p, 0, n);
    return p;
}

size_t osp_pages_size(size_t n) {
    long v = sysconf(_SC_PAGESIZE);
    size_t page = v > 0 ? (size_t)v : 4096;
    return (n + page - 1) / page * page;
}

void *osp_pages_alloc(osp_pool pool, size_t n) {
    if (pool >= OSP_POOL_COUNT || n > SIZE_MAX / 2) return NULL;
    size_t len = osp_pages_size(n ? n : 1);
    /* populated now: the block is written at once (a copy) or soon, and one
     * call faults its pages in faster than a fault per page */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    atomic_fetch_add(&pool_bytes[pool], len);
    return p;
}

void osp_pages_free(osp_pool pool, void *p, size_t n) {
    if (!p || pool >= OSP_POOL_COUNT) return;
    size_t len = osp_pages_size(n ? n : 1);
    atomic_fetch_sub(&pool_bytes[pool], len);
    munmap(p, len);
}

void osp_alloc_long_running(void) {
#ifdef M_MMAP_THRESHOLD
    mallopt(M_MMAP_THRESHOLD, 128 * 1024); /* glibc's starting value; set, it no longer moves */
#endif
}

void osp_free(void *p) {
    if (!p) return;
    size_t *h = (size_t *)((char *)p - HDR);
    atomic_fetch_sub(&pool_bytes[h[1]], h[0]);
    if (h[2]) munmap((void *)(uintptr_t)h[3], h[4]);
    else free(h);
}

size_t osp_pool_bytes(osp_pool pool) {
    return pool < OSP_POOL_COUNT ? atomic_load(&pool_bytes[pool]) : 0;
}

double osp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int osp_ncpu(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
