/* backend/: choosing a device. OSP_DEVICE=cpu|cuda in the environment
 * overrides AUTO (tests and comparisons). A device asked for but absent
 * (no GPU, or a build without CUDA) is a warning, and the CPU runs the
 * model, as llama-server does with -ngl on such a machine. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "backend/backend.h"
#include "core/options.h"

#ifndef OSP_HAVE_CUDA
const osp_backend *osp_backend_cuda(void) {
    osp_err(OSP_ERR_UNSUPPORTED, "this build of osprey has no CUDA backend (the CUDA toolkit was not found)");
    return NULL;
}
#endif

const osp_backend *osp_backend_get(osp_device d) {
    if (d == OSP_DEVICE_AUTO) {
        const char *e = osp_options_get()->device;
        if (e && !strcmp(e, "cpu")) d = OSP_DEVICE_CPU;
        else if (e && !strcmp(e, "cuda")) d = OSP_DEVICE_CUDA;
    }
    switch (d) {
    case OSP_DEVICE_CPU: return osp_backend_cpu();
    case OSP_DEVICE_CUDA: {
        const osp_backend *g = osp_backend_cuda();
        if (g) return g;
        OSP_LOG(0, "osprey: warning: the GPU was asked for, but %s; running on the CPU", osp_last_error());
        osp_err_clear();
        return osp_backend_cpu();
    }
    case OSP_DEVICE_AUTO: break;
    }
    const osp_backend *g = osp_backend_cuda(); /* the GPU when there is one */
    if (g) return g;
    osp_err_clear();
    return osp_backend_cpu();
}

osp_status osp_backend_bw_trial(const osp_backend *be, int release, double *gbps) {
    if (!be->bw_trial) return osp_err(OSP_ERR_UNSUPPORTED, "%s: no bandwidth probe", be->name);
    double g = be->bw_trial(release);
    if (release) return OSP_OK;
    if (g < 0) return osp_err(OSP_ERR_IO, "%s: the bandwidth probe failed", be->name);
    *gbps = g;
    return OSP_OK;
}
