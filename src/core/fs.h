/* core/fs: small file-system helpers shared by the loaders. */
#ifndef OSP_FS_H
#define OSP_FS_H

#include <stddef.h>

int osp_is_file(const char *path);
int osp_is_dir(const char *path);
/* A Hugging Face cache repo folder (models--ORG--NAME): writes the snapshot
 * named by refs/main (else the last one listed) to out and returns 1;
 * returns 0 when `repo` has no snapshots. */
int osp_hf_snapshot(const char *repo, char *out, size_t n);

#endif
