#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "fs.h"
#include "options.h"

int osp_is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

int osp_is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int osp_hf_snapshot(const char *repo, char *out, size_t n) {
    char p[4096], ref[256] = "";
    snprintf(p, sizeof p, "%s/snapshots", repo);
    if (!osp_is_dir(p)) return 0;
    snprintf(p, sizeof p, "%s/refs/main", repo);
    FILE *f = fopen(p, "r");
    if (f) {
        if (fgets(ref, sizeof ref, f)) ref[strcspn(ref, "\r\n")] = 0;
        fclose(f);
    }
    if (ref[0] && !strchr(ref, '/') && strcmp(ref, "..") != 0) {
        snprintf(out, n, "%s/snapshots/%s", repo, ref);
        if (osp_is_dir(out)) return 1;
    }
    snprintf(p, sizeof p, "%s/snapshots", repo);
    DIR *d = opendir(p);
    int found = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(out, n, "%s/snapshots/%s", repo, de->d_name);
        found = 1;
    }
    if (d) closedir(d);
    return found;
}

osp_status osp_resolve_model_dir(const char *path, char *out, size_t n) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", path);
    if (osp_is_file(p)) {
        snprintf(out, n, "%s", path);
        return OSP_OK;
    }
    if (osp_hf_snapshot(path, out, n)) return OSP_OK;
    if (!osp_is_dir(path)) return osp_err(OSP_ERR_IO, "%s: no such model folder", path);
    return osp_err(OSP_ERR_IO, "%s: no config.json (not a model folder or Hugging Face cache repo)", path);
}

int osp_cache_dir(char *out, size_t n) {
    const osp_options *o = osp_options_get();
    if (o->cache_home) snprintf(out, n, "%s/osprey", o->cache_home);
    else if (o->home) snprintf(out, n, "%s/.cache/osprey", o->home);
    else return 0;
    return 1;
}

int osp_mkdirs(const char *path) {
    char p[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof p) return errno = ENAMETOOLONG, -1;
    memcpy(p, path, len + 1);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
        *c = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
    return osp_is_dir(p) ? 0 : (errno = ENOTDIR, -1);
}
