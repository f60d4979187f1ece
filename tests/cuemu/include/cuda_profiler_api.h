/* tests/cuemu: the profiler's start and stop (nothing to profile). */
#ifndef OSP_CUEMU_PROFILER_API_H
#define OSP_CUEMU_PROFILER_API_H
#include "cuda_runtime_api.h"
static inline cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
static inline cudaError_t cudaProfilerStop(void) { return cudaSuccess; }
#endif
