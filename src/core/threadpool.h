/* core/threadpool: one process-wide pool of worker threads.
 *
 * osp_parallel_for(n, fn, ctx) runs fn(ctx, i) for i in [0, n) on the
 * calling thread plus the workers, and returns when all are done. Tasks
 * are claimed through an atomic counter. Workers spin briefly between
 * jobs (decode issues hundreds of small jobs per token) and then sleep.
 * Calls must not be nested; calls from several threads take turns (a lock).
 */
#ifndef OSP_THREADPOOL_H
#define OSP_THREADPOOL_H

#include <stdint.h>

typedef void (*osp_task_fn)(void *ctx, int64_t task);

/* Start (or resize) the pool; n_threads counts the caller. 0 = all cores. */
int osp_threads_init(int n_threads);
int osp_threads_count(void);
void osp_threads_shutdown(void);
void osp_parallel_for(int64_t n_tasks, osp_task_fn fn, void *ctx);

#endif
