/* model/safetensors: read-only, mmapped safetensors checkpoints.
 *
 * A checkpoint is one file or a set of shards. Every header is validated
 * before any tensor is handed out: bounded header size, known dtypes,
 * shapes whose byte size equals data_offsets' span, spans inside the file
 * and not overlapping. Errors name the file and the tensor. Tensor data
 * pointers point into the mapping and may be unaligned.
 */
#ifndef OSP_SAFETENSORS_H
#define OSP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "tensor/tensor.h"

#define OSP_ST_MAX_DIMS 8
#define OSP_ST_MAX_HEADER (100u << 20)

typedef struct osp_st_tensor {
    char *name;
    osp_dtype dtype;
    int ndim;
    int64_t shape[OSP_ST_MAX_DIMS];
    int64_t numel;
    const void *data;
    size_t nbytes;
    int file;           /* index into osp_st.files */
} osp_st_tensor;

typedef struct osp_st_file {
    char *path;
    void *map;
    size_t size;
    int borrowed;       /* map is the caller's memory (osp_st_open_mem): not unmapped */
} osp_st_file;

typedef struct osp_st {
    osp_st_file *files;
    int n_files;
    osp_st_tensor *tensors; /* sorted by name */
    int n_tensors;
} osp_st;

/* Open a single safetensors file. */
osp_status osp_st_open_file(const char *path, osp_st **out);
/* The same checks on a safetensors image in memory (borrowed: it must
 * outlive the osp_st; tensor data points into it). name is for messages. */
osp_status osp_st_open_mem(const void *buf, size_t n, const char *name, osp_st **out);
/* Open a model folder: model.safetensors.index.json (shards), else
 * model.safetensors, else every *.safetensors file in the folder. */
osp_status osp_st_open_dir(const char *dir, osp_st **out);
void osp_st_close(osp_st *st);

const osp_st_tensor *osp_st_find(const osp_st *st, const char *name);

#endif
