/* backend/: choosing a device. OSP_DEVICE=cpu|cuda in the environment
 * overrides AUTO (tests and comparisons). */
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"

#ifndef OSP_HAVE_CUDA
const osp_backend *osp_backend_cuda(void) {
    osp_err(OSP_ERR_UNSUPPORTED, "this build of osprey has no CUDA backend (the CUDA toolkit was not found)");
    return NULL;
}
#endif

const osp_backend *osp_backend_get(osp_device d) {
    if (d == OSP_DEVICE_AUTO) {
        const char *e = getenv("OSP_DEVICE");
        if (e && !strcmp(e, "cpu")) d = OSP_DEVICE_CPU;
        else if (e && !strcmp(e, "cuda")) d = OSP_DEVICE_CUDA;
    }
    switch (d) {
    case OSP_DEVICE_CPU: return osp_backend_cpu();
    case OSP_DEVICE_CUDA: return osp_backend_cuda();
    case OSP_DEVICE_AUTO: break;
    }
    const osp_backend *g = osp_backend_cuda(); /* the GPU when there is one */
    if (g) return g;
    osp_err_clear();
    return osp_backend_cpu();
}
