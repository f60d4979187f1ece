// backend/cuda/launch.cuh: how the backend's kernels are launched and how a kernel names its dynamic shared memory,
// in one place for the kernel files (*.cu) (tests/cuemu, the CUDA emulator on the CPU, supplies both
// through its cuda_runtime.h as well).
#pragma once
#include <cuda_runtime.h>
#include <utility>

// a kernel's dynamic shared memory (the launch's shm bytes) as an array of T
#ifndef OSP_DYN_SHARED
#define OSP_DYN_SHARED(T, name) extern __shared__ T name[]
#endif

// launch kernel k through cudaLaunchKernelEx (the runtime's typed launch: the arguments are converted to the
// kernel's parameter types, as a <<<...>>> launch does), with programmatic dependent launch allowed when pdl is set
// (the kernel then begins with griddepcontrol.wait before it reads what an earlier kernel wrote)
template <typename... K, typename... A>
static inline void osp_cu_launch(void (*k)(K...), dim3 grid, dim3 block, size_t shm, cudaStream_t st, int pdl,
                                 A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shm, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}
