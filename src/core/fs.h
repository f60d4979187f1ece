/* core/fs: small file-system helpers shared by the loaders. */
#ifndef OSP_FS_H
#define OSP_FS_H

#include <stddef.h>
#include "core/core.h"

int osp_is_file(const char *path);
int osp_is_dir(const char *path);
/* A Hugging Face cache repo folder (models--ORG--NAME): writes the snapshot
 * named by refs/main (else the last one listed) to out and returns 1;
 * returns 0 when `repo` has no snapshots. */
int osp_hf_snapshot(const char *repo, char *out, size_t n);

/* A model folder (with config.json), or a Hugging Face cache repo folder
 * resolved to its snapshot, into out; OSP_ERR_IO with a message otherwise. */
osp_status osp_resolve_model_dir(const char *path, char *out, size_t n);

/* osprey's cache folder: $XDG_CACHE_HOME/osprey, else $HOME/.cache/osprey
 * (0 when neither is set). */
int osp_cache_dir(char *out, size_t n);
/* mkdir -p (mode 0755); 0 on success, else -1 with errno. */
int osp_mkdirs(const char *path);

#endif
