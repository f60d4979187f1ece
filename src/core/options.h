/* core/options: every setting osprey takes from the environment, read in this one place.
 *
 * The environment is parsed once a process (the first osp_options_get, under pthread_once) into one struct,
 * which every other module reads; nothing else calls getenv. docs/OPTIONS.md is the table of the switches:
 * user settings, off-switches of a default, and test or diagnostic hooks.
 *
 * Tests change a setting in-process with osp_options_set, as if the environment said so, with no other thread
 * using osprey at the time: readers do not lock. Where a setting is taken matters: a session copies the CUDA
 * graphs and fusion switches when it is made, and the chain switch at its first chain; the others are read at
 * each use.
 */
#ifndef OSP_OPTIONS_H
#define OSP_OPTIONS_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_options {
    /* user settings */
    const char *device;      /* OSP_DEVICE: "cpu", "cuda", or NULL: the GPU when there is one */
    const char *isa;         /* OSP_ISA: "scalar", "avx2", or NULL: the best the CPU runs */
    int amx;                 /* OSP_AMX=0: 0, AMX not used; else 1 */
    int bf16t;               /* OSP_BF16T: 1 by default (AMX, else VDPBF16PS), 0 ("0": no bf16 engine), 2 ("dot":
                                VDPBF16PS where both exist) */
    const char *model;       /* OSPREY_MODEL: the CLI's default model folder, or NULL */
    const char *cache_home;  /* XDG_CACHE_HOME (the cache is cache_home/osprey), or NULL */
    const char *home;        /* HOME (else home/.cache/osprey), or NULL */
    /* off-switches of a default */
    int chain;               /* OSP_CHAIN=0: 0, a chain's steps fed from the host; else 1 */
    int serve_chain;         /* OSP_SERVE_CHAIN: -1 unset (the server chains where the backend queues steps), 0
                                never, 1 always (the CPU too) */
    int cuda_graphs;         /* OSP_CUDA_GRAPHS=0: 0, decode steps run eagerly; else 1 */
    int cuda_pdl;            /* OSP_CUDA_PDL=0: 0, no programmatic dependent launch; else 1 */
    int cuda_fuse;           /* OSP_CUDA_FUSE=0: 0, every CUDA launch on its own; else 1 */
    int cuda_moe_host;       /* OSP_CUDA_MOE=host: 1, routed experts on the host path; else 0 */
    /* test and diagnostic hooks */
    int att_noscratch;       /* OSP_ATT_NOSCRATCH=1: 1, CPU attention a token at a time (no tiles); else 0 */
    int cuda_profile_rows;   /* OSP_CUDA_PROFILE_ROWS=N: the profiler's window around the third decode step of
                                N rows or more; 0 none */
    int cuda_attention;      /* (osp_options_set only, "cuda_attention") the attention kernel of an f32 cache:
                                0 by the step's tokens (the default), 1 the split kernel always, 2 the compact
                                kernel always */
} osp_options;

/* The process's options (parsed from the environment on the first call). */
const osp_options *osp_options_get(void);

/* Set one option as if the environment held name=value (value NULL: as if unset), after the first parse.
 * name is a variable of the table (OSP_CUDA_FUSE, ...) or a hook without one ("cuda_attention"). For tests:
 * no other thread may be using osprey. OSP_ERR_INVALID for an unknown name. */
osp_status osp_options_set(const char *name, const char *value);

#ifdef __cplusplus
}
#endif

#endif
