#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>
#include "core.h"
#include "threadpool.h"

#define MAX_THREADS 256
/* Idle workers spin this long for the next job (decode issues jobs back to
 * back), then sleep. Waiting threads yield the CPU after a short spin, so
 * an oversubscribed machine (another process on our cores) degrades
 * gracefully instead of spinning against a descheduled worker. */
#define SPIN_ITERS 20000
#define YIELD_AFTER 2000

static struct {
    pthread_t tid[MAX_THREADS];
    int n;                    /* threads including the caller */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;     /* bumped for each job */
    _Atomic int stop;
    osp_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    _Atomic int64_t next;     /* next task to claim */
    _Atomic int active;       /* workers still inside this job */
    int started;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void run_tasks(void) {
    for (;;) {
        int64_t t = atomic_fetch_add(&P.next, 1);
        if (t >= P.n_tasks) break;
        P.fn(P.ctx, t);
    }
}

static void *worker(void *arg) {
    (void)arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop)) {
            if (++spins < SPIN_ITERS) {
                if (spins < YIELD_AFTER) __builtin_ia32_pause();
                else sched_yield();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            while (atomic_load(&P.gen) == seen && !atomic_load(&P.stop))
                pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.stop)) return NULL;
        seen = g;
        run_tasks();
        atomic_fetch_sub(&P.active, 1);
    }
}

void osp_threads_shutdown(void) {
    if (!P.started) return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.stop, 1);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    for (int i = 1; i < P.n; i++) pthread_join(P.tid[i], NULL);
    P.started = 0;
    P.n = 1;
    atomic_store(&P.stop, 0);
}

int osp_threads_init(int n) {
    if (n <= 0) n = osp_ncpu();
    if (n > MAX_THREADS) n = MAX_THREADS;
    if (P.started && P.n == n) return n;
    osp_threads_shutdown();
    P.n = n;
    P.started = 1;
    atomic_store(&P.gen, 0);
    for (int i = 1; i < n; i++) {
        if (pthread_create(&P.tid[i], NULL, worker, NULL) != 0) {
            P.n = i;
            break;
        }
    }
    return P.n;
}

int osp_threads_count(void) { return P.started ? P.n : 1; }

static pthread_mutex_t g_callers = PTHREAD_MUTEX_INITIALIZER;

void osp_parallel_for(int64_t n_tasks, osp_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!P.started) osp_threads_init(0);
    if (P.n == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&g_callers); /* callers on several threads (the server's embeddings beside its batch) take turns */
    P.fn = fn;
    P.ctx = ctx;
    P.n_tasks = n_tasks;
    atomic_store(&P.next, 0);
    atomic_store(&P.active, P.n - 1);
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add(&P.gen, 1);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    run_tasks();
    for (int spins = 0; atomic_load(&P.active) > 0; spins++) {
        if (spins < YIELD_AFTER) __builtin_ia32_pause();
        else sched_yield();
    }
    pthread_mutex_unlock(&g_callers);
}
