/* model/st_write: a small safetensors writer.
 *
 * Declare every tensor first (name, dtype, shape, and either its bytes or
 * NULL), then write the file in one pass:
 *   bytes 0-7   u64 LE header length N (a multiple of 8)
 *   bytes 8..   JSON header {"__metadata__":{..}, name:{dtype, shape,
 *               data_offsets:[begin,end]}, ...}, padded with spaces to N
 *   then        the tensors' bytes, back to back, in declaration order.
 * Tensors declared with data == NULL are produced at write time by a fill
 * callback, in chunks, so a multi-GB file never has to be in memory.
 *
 * Ownership: the writer copies names, shapes and metadata strings. It does
 * NOT copy tensor data: a non-NULL data pointer passed to
 * osp_st_writer_add must stay valid until osp_st_writer_write returns.
 */
#ifndef OSP_ST_WRITE_H
#define OSP_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "tensor/tensor.h"

#define OSP_ST_WRITER_MAX_DIMS 8

typedef struct osp_st_writer osp_st_writer;

/* Produce bytes of tensor `index` (declaration order, from 0): the dim-0
 * slices [row0, row0+nrows) into buf[nbytes], nbytes = nrows · (bytes of
 * one slice). Chunks of one tensor come in increasing row order and
 * together cover it exactly once; tensors come in declaration order. A
 * 0-d tensor is one chunk with row0 = 0, nrows = 1; empty tensors are not
 * asked for. Return OSP_OK, or a status (with osp_err) to abort the
 * write. */
typedef osp_status (*osp_st_fill_fn)(void *ctx, int64_t index, int64_t row0,
                                     int64_t nrows, void *buf, size_t nbytes);

/* NULL when out of memory. */
osp_st_writer *osp_st_writer_new(void);
void osp_st_writer_free(osp_st_writer *w);

/* Add (or replace) a string entry of the __metadata__ map, e.g.
 * ("format", "mlx"). */
osp_status osp_st_writer_set_meta(osp_st_writer *w, const char *key, const char *value);

/* Declare a tensor. shape[ndim], 0 <= ndim <= 8; nbytes must equal
 * prod(shape) · sizeof(dtype). data: its bytes (referenced, not copied),
 * or NULL to have the fill callback produce them. Names must be unique,
 * non-empty and not "__metadata__". */
osp_status osp_st_writer_add(osp_st_writer *w, const char *name, osp_dtype dtype, int ndim,
                             const int64_t *shape, const void *data, size_t nbytes);

int64_t osp_st_writer_count(const osp_st_writer *w);
/* Total size of the data section declared so far. */
uint64_t osp_st_writer_data_bytes(const osp_st_writer *w);

/* Largest chunk handed to the fill callback (default 64 MiB; a chunk is
 * never smaller than one dim-0 slice). */
void osp_st_writer_set_chunk_bytes(osp_st_writer *w, size_t bytes);

/* Write the file at `path` (created or truncated). fill may be NULL when
 * every tensor has data. On failure the partial file is removed. The
 * writer can be written again or freed afterwards. */
osp_status osp_st_writer_write(osp_st_writer *w, const char *path, osp_st_fill_fn fill,
                               void *ctx);

#endif
