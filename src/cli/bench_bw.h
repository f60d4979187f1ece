/* The memory-bandwidth probes `osprey bench` judges a decode by, each a
 * series of trials run between the decode's steps (so both figures come
 * from the same seconds of a machine whose bandwidth drifts):
 *   read    a streaming read, on the bench's threads, of a buffer as large
 *           as the weights a step streams (at least 512 MiB, at most
 *           4 GiB: beyond the caches either way), on huge pages as the
 *           weights are placed. What a decode does: the reference figure.
 *   triad   STREAM's a = b + 3c on 32 Mi floats an array (2 reads, 1
 *           write), on huge pages or on the 4 KiB pages a plain STREAM
 *           binary gets; kept beside the read for comparison with STREAM.
 *   device  a GPU model's own read kernel over a buffer beyond its L2.
 * A probe's figure is its best trial (STREAM's "best rate"); the mean over
 * all trials is kept too. */
#ifndef OSP_CLI_BENCH_BW_H
#define OSP_CLI_BENCH_BW_H

#include <stddef.h>
#include <stdint.h>
#include "osprey.h"

typedef struct osp_bw_probe {
    int kind;                 /* 0 none, 1 read, 2 triad, 3 device */
    void *a, *b, *c;          /* read: a; triad: the three arrays */
    int64_t n, block;         /* elements (read: 64-byte vectors; triad: floats), a thread's slice */
    const osp_model *dev;
    double bytes, secs, best; /* totals over the trials; the best trial's GB/s */
    int trials;
} osp_bw_probe;

/* Each returns 1 when the probe is ready, 0 when it could not be set up
 * (its memory, or no device probe). */
int osp_bw_open_read(osp_bw_probe *pr, size_t weight_bytes);
int osp_bw_open_triad(osp_bw_probe *pr, int huge);
int osp_bw_open_device(osp_bw_probe *pr, const osp_model *m);
void osp_bw_trial(osp_bw_probe *pr);
double osp_bw_mean(const osp_bw_probe *pr); /* GB/s over all trials */
void osp_bw_close(osp_bw_probe *pr);

#endif
