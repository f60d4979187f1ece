/* backend/cuda/blas: cuBLAS, opened at run time (dlopen), for the
 * production path's prefill GEMMs on the tensor cores. Opening it at run
 * time keeps the osprey binary free of a link-time dependency on the CUDA
 * libraries: a CUDA build starts on a machine without them and runs on the
 * CPU; a GPU machine without cuBLAS runs prefill on the backend's own
 * kernels. */
#include "backend/cuda/blas.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "core/core.h"

/* cuBLAS's ABI (cublas_api.h), restated so that no cuBLAS header or
 * library is needed to build: these values are fixed across CUDA 11-13. */
typedef int cublas_status;
typedef void *cublas_handle;
enum { CUBLAS_OP_N_ = 0, CUBLAS_OP_T_ = 1 };
enum { CUDA_R_32F_ = 0, CUDA_R_16BF_ = 14 };
enum { CUBLAS_COMPUTE_32F_ = 68 };
enum { CUBLAS_GEMM_DEFAULT_ = -1 };

static struct {
    pthread_once_t once;
    void *lib;
    cublas_status (*create)(cublas_handle *);
    cublas_status (*destroy)(cublas_handle);
    cublas_status (*set_stream)(cublas_handle, void *);
    cublas_status (*gemm_ex)(cublas_handle, int, int, int, int, int, const void *, const void *, int, int,
                             const void *, int, int, const void *, void *, int, int, int, int);
    char why[256];
} B = {.once = PTHREAD_ONCE_INIT};

#ifdef OSP_CUDA_EMU
/* the CUDA emulator (tests/cuemu) supplies the four functions (its cuda_runtime_api.h declares them) */
#include <cuda_runtime_api.h>
static void open_lib(void) {
    static char self;
    B.lib = &self;
    B.create = osp_cuemu_cublas_create, B.destroy = osp_cuemu_cublas_destroy;
    B.set_stream = osp_cuemu_cublas_set_stream, B.gemm_ex = osp_cuemu_cublas_gemm_ex;
}
#else
static void open_lib(void) {
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !B.lib; i++) B.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!B.lib) {
        snprintf(B.why, sizeof B.why, "cuBLAS not found (%s)", dlerror());
        return;
    }
    *(void **)&B.create = dlsym(B.lib, "cublasCreate_v2");
    *(void **)&B.destroy = dlsym(B.lib, "cublasDestroy_v2");
    *(void **)&B.set_stream = dlsym(B.lib, "cublasSetStream_v2");
    *(void **)&B.gemm_ex = dlsym(B.lib, "cublasGemmEx");
    if (!B.create || !B.destroy || !B.set_stream || !B.gemm_ex) {
        snprintf(B.why, sizeof B.why, "cuBLAS lacks the functions osprey uses");
        dlclose(B.lib);
        B.lib = NULL;
    }
}
#endif

void *osp_cublas_new(void *stream) {
    pthread_once(&B.once, open_lib);
    if (!B.lib) {
        static int said;
        if (!said++) OSP_LOG(1, "osprey: %s; prefill runs on osprey's own GPU kernels", B.why);
        return NULL;
    }
    cublas_handle h = NULL;
    if (B.create(&h) != 0) return NULL;
    if (B.set_stream(h, stream) != 0) {
        B.destroy(h);
        return NULL;
    }
    return h;
}

void osp_cublas_free(void *h) {
    if (h) B.destroy(h);
}

int osp_cublas_gemm_bf16(void *h, int64_t rows, int64_t n, int64_t cols, const void *w, const void *x, float *y,
                         int64_t ldy) {
    /* column-major: Y (rows x n, ld ldy) = Wᵀ (W: cols x rows, ld cols) · X (cols x n, ld cols) */
    const float one = 1.0f, zero = 0.0f;
    return B.gemm_ex(h, CUBLAS_OP_T_, CUBLAS_OP_N_, (int)rows, (int)n, (int)cols, &one, w, CUDA_R_16BF_, (int)cols, x,
                     CUDA_R_16BF_, (int)cols, &zero, y, CUDA_R_32F_, (int)ldy, CUBLAS_COMPUTE_32F_,
                     CUBLAS_GEMM_DEFAULT_);
}
