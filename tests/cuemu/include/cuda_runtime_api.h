/* tests/cuemu: a CUDA emulator on the CPU. It stands in for the CUDA toolkit's
 * headers and runtime when osprey is configured with -DOSP_CUDA_EMU=ON, so
 * that the CUDA backend's own code (cuda.c, step.c, the kernels in
 * kernels*.cu, compiled as C++) runs, slowly, on a machine without a GPU: a
 * block's threads are fibers, warps exchange values at their collectives
 * (shuffles, mma.sync), __syncthreads is a barrier, and the emulator checks
 * what the hardware would reject or leave undefined (launch limits, a stream
 * used wrongly while captured, misaligned vector loads and cp.async, warps
 * whose lanes meet different collectives, barriers that never complete).
 * See tests/cuemu/README.md.
 *
 * This header: the runtime API's functions that osprey calls (C and C++). */
#ifndef OSP_CUEMU_RUNTIME_API_H
#define OSP_CUEMU_RUNTIME_API_H
#include <stddef.h>
#include <stdint.h>

#define OSP_CUEMU 1

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorIllegalState = 401,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};

enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 5 };

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int multiProcessorCount;
    int maxThreadsPerBlock;
    int warpSize;
    int major, minor;
};
typedef struct cudaDeviceProp cudaDeviceProp;

typedef struct cudaLaunchAttribute {
    enum cudaLaunchAttributeID id;
    union {
        int programmaticStreamSerializationAllowed;
    } val;
} cudaLaunchAttribute;

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamCreate(cudaStream_t *st);
cudaError_t cudaStreamDestroy(cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t st);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaEventCreate(cudaEvent_t *e);
#define cudaEventDisableTiming 0x02
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute a, int v);

/* cuBLAS's four functions that backend/cuda/blas.c calls, by the same ABI
 * (it names them through pointers): a plain f32-accumulated GEMM. */
int osp_cuemu_cublas_create(void **h);
int osp_cuemu_cublas_destroy(void *h);
int osp_cuemu_cublas_set_stream(void *h, void *st);
int osp_cuemu_cublas_gemm_ex(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at,
                             int lda, const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc,
                             int compute, int algo);

#ifdef __cplusplus
}
#endif
#endif
