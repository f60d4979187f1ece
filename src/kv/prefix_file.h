/* kv/prefix_file: the prefix cache's files (internal to kv/prefix.c).
 *
 * A file, little-endian:
 *   "OSPKVC" 0 1 (magic, format version 1) | namespace, 64 hex digits |
 *   u32 tokens n | u32 layers | u64 file size |
 *   i32 tokens[n] |
 *   per layer with storage, in order: u32 layer | u32 slots | u64 bytes | the block as kept in memory
 *     (K then V, planes [Hkv, slots, x]: osp_kv) |
 *   the SHA-256 of everything before it (32 bytes).
 * The name is the first 40 hex digits of sha256(tokens) + ".kvc". */
#ifndef OSP_PREFIX_FILE_H
#define OSP_PREFIX_FILE_H

#include <stdint.h>
#include "kv/kv.h"

#define OSP_PCF_NAME 48 /* name buffer: 40 hex + ".kvc" + NUL */

void osp_pcf_name(const int32_t *tokens, int32_t n, char out[OSP_PCF_NAME]);
/* Write kv's row 0 (holding tokens[0, n)) as dir/name, atomically. */
osp_status osp_pcf_write(const char *dir, const char *ns, const int32_t *tokens, int32_t n, const osp_kv *kv,
                         const char *name, int64_t *size);
/* A file's tokens, after checking its header against ns and its size
 * (*tokens malloc'd). OSP_ERR_FORMAT for a foreign or broken file. */
osp_status osp_pcf_read_head(const char *path, const char *ns, int32_t **tokens, int32_t *n, int64_t *size);
/* The whole file as a one-row cache like `like`, its tokens and checksum
 * verified. */
osp_status osp_pcf_load(const char *path, const char *ns, const int32_t *tokens, int32_t n, const osp_kv *like,
                        osp_kv **out);
/* Delete the least recently used (oldest mtime) *.kvc files under root/kv/
 * until they take at most `budget` bytes; returns how many were deleted. */
int osp_pcf_enforce(const char *root, int64_t budget);

#endif
