/* backend/: choosing a device. */
#include "backend/backend.h"

const osp_backend *osp_backend_get(osp_device d) {
    switch (d) {
    case OSP_DEVICE_AUTO:
    case OSP_DEVICE_CPU: return osp_backend_cpu();
    case OSP_DEVICE_CUDA: break;
    }
    osp_err(OSP_ERR_UNSUPPORTED, "this build of osprey has no CUDA backend");
    return NULL;
}
