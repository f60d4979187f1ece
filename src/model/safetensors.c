#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "safetensors.h"

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const osp_st_tensor *)a)->name, ((const osp_st_tensor *)b)->name);
}

typedef struct span { uint64_t b, e; const char *name; } span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e < y->e ? -1 : x->e > y->e);
}

static osp_status map_file(const char *path, osp_st_file *f) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return osp_err(OSP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return osp_err(OSP_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    f->map = NULL;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            close(fd);
            f->map = NULL;
            return osp_err(OSP_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
    }
    close(fd);
    f->path = strdup(path);
    return f->path ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
}

/* Parse one tensor entry of a header; fills t (name set by caller). */
static osp_status parse_entry(const char *path, const char *name, json_t *v,
                              uint64_t data_size, const unsigned char *data,
                              osp_st_tensor *t, span *sp) {
    if (!json_is_object(v))
        return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': missing or malformed dtype/shape/data_offsets",
                       path, name);
    const char *ds = json_string_value(jd);
    int dt = osp_dtype_parse(ds);
    if (dt < 0) {
        if (strncmp(ds, "F8", 2) == 0)
            return osp_err(OSP_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s (fp8) is not supported",
                           path, name, ds);
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", path, name, ds);
    }
    size_t nd = json_array_size(js);
    if (nd > OSP_ST_MAX_DIMS)
        return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (max %d)", path, name, nd,
                       OSP_ST_MAX_DIMS);
    uint64_t numel = 1;
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': bad shape", path, name);
        uint64_t x = (uint64_t)json_integer_value(d);
        if (x != 0 && numel > UINT64_MAX / x)
            return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        numel *= x;
        t->shape[i] = (int64_t)x;
    }
    json_t *j0 = json_array_get(jo, 0), *j1 = json_array_get(jo, 1);
    if (!json_is_integer(j0) || !json_is_integer(j1) || json_integer_value(j0) < 0 ||
        json_integer_value(j1) < json_integer_value(j0))
        return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, name);
    uint64_t b = (uint64_t)json_integer_value(j0), e = (uint64_t)json_integer_value(j1);
    uint64_t es = osp_dtype_size((osp_dtype)dt);
    if (numel > UINT64_MAX / es || numel * es != e - b)
        return osp_err(OSP_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets span %llu bytes but shape x dtype needs %llu",
                       path, name, (unsigned long long)(e - b), (unsigned long long)(numel * es));
    if (e > data_size)
        return osp_err(OSP_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the file "
                       "(data section is %llu bytes; truncated?)",
                       path, name, (unsigned long long)b, (unsigned long long)e,
                       (unsigned long long)data_size);
    t->dtype = (osp_dtype)dt;
    t->numel = (int64_t)numel;
    t->nbytes = (size_t)(e - b);
    t->data = data + b;
    sp->b = b;
    sp->e = e;
    sp->name = name;
    return OSP_OK;
}

/* Validate the header of mapped file `fi` and append its tensors. */
static osp_status load_header(osp_st *st, int fi) {
    osp_st_file *f = &st->files[fi];
    const unsigned char *m = f->map;
    if (f->size < 8)
        return osp_err(OSP_ERR_FORMAT, "%s: too short to be a safetensors file (%zu bytes)", f->path,
                       f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | m[i];
    if (n > OSP_ST_MAX_HEADER)
        return osp_err(OSP_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", f->path,
                       (unsigned long long)n, OSP_ST_MAX_HEADER);
    if (8 + n > f->size)
        return osp_err(OSP_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                       f->path, (unsigned long long)n, f->size);
    json_error_t je;
    json_t *root = json_loadb((const char *)m + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) return osp_err(OSP_ERR_FORMAT, "%s: header is not valid JSON: %s", f->path, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return osp_err(OSP_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    size_t cnt = json_object_size(root);
    osp_st_tensor *nt = realloc(st->tensors, (st->n_tensors + cnt) * sizeof *nt + 1);
    span *spans = malloc(cnt * sizeof *spans + 1);
    if (!nt || !spans) {
        free(spans);
        if (nt) st->tensors = nt;
        json_decref(root);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    st->tensors = nt;
    uint64_t data_size = f->size - 8 - n;
    const unsigned char *data = m + 8 + n;
    size_t ns = 0;
    const char *key;
    json_t *v;
    osp_status rc = OSP_OK;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        osp_st_tensor *t = &st->tensors[st->n_tensors];
        memset(t, 0, sizeof *t);
        rc = parse_entry(f->path, key, v, data_size, data, t, &spans[ns]);
        if (rc != OSP_OK) break;
        t->name = strdup(key);
        t->file = fi;
        if (!t->name) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory");
            break;
        }
        spans[ns].name = t->name;
        st->n_tensors++;
        ns++;
    }
    if (rc == OSP_OK) {
        qsort(spans, ns, sizeof *spans, cmp_span);
        for (size_t i = 1; i < ns; i++) {
            if (spans[i].b < spans[i - 1].e && spans[i].e > spans[i].b) {
                rc = osp_err(OSP_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                             f->path, spans[i - 1].name, spans[i].name);
                break;
            }
        }
    }
    free(spans);
    json_decref(root);
    return rc;
}

static osp_status add_file(osp_st *st, const char *path) {
    osp_st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf) return osp_err(OSP_ERR_NOMEM, "out of memory");
    st->files = nf;
    memset(&st->files[st->n_files], 0, sizeof *nf);
    OSP_TRY(map_file(path, &st->files[st->n_files]));
    st->n_files++;
    return load_header(st, st->n_files - 1);
}

static osp_status finish(osp_st *st) {
    qsort(st->tensors, st->n_tensors, sizeof *st->tensors, cmp_tensor_name);
    for (int i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0)
            return osp_err(OSP_ERR_FORMAT, "tensor '%s' appears in both %s and %s",
                           st->tensors[i].name, st->files[st->tensors[i - 1].file].path,
                           st->files[st->tensors[i].file].path);
    return OSP_OK;
}

osp_status osp_st_open_file(const char *path, osp_st **out) {
    *out = NULL;
    osp_st *st = calloc(1, sizeof *st);
    if (!st) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_status rc = add_file(st, path);
    if (rc == OSP_OK) rc = finish(st);
    if (rc != OSP_OK) {
        osp_st_close(st);
        return rc;
    }
    *out = st;
    return OSP_OK;
}

osp_status osp_st_open_mem(const void *buf, size_t n, const char *name, osp_st **out) {
    *out = NULL;
    osp_st *st = calloc(1, sizeof *st);
    osp_st_file *f = calloc(1, sizeof *f);
    char *p = strdup(name ? name : "(memory)");
    if (!st || !f || !p) {
        free(st), free(f), free(p);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    f->path = p;
    f->map = (void *)buf;
    f->size = n;
    f->borrowed = 1;
    st->files = f;
    st->n_files = 1;
    osp_status rc = load_header(st, 0);
    if (rc == OSP_OK) rc = finish(st);
    if (rc != OSP_OK) {
        osp_st_close(st);
        return rc;
    }
    *out = st;
    return OSP_OK;
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Shards listed in model.safetensors.index.json; every tensor named in
 * weight_map must be present in the shard it names. */
static osp_status open_index(osp_st *st, const char *dir, const char *idx) {
    json_error_t je;
    json_t *root = json_load_file(idx, 0, &je);
    if (!root) return osp_err(OSP_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", idx, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    osp_status rc = OSP_OK;
    if (!json_is_object(wm)) {
        json_decref(root);
        return osp_err(OSP_ERR_FORMAT, "%s: no weight_map object", idx);
    }
    size_t nfiles = 0;
    char **names = calloc(json_object_size(wm) + 1, sizeof *names);
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *fn = json_string_value(v);
        if (!fn || strchr(fn, '/')) {
            rc = osp_err(OSP_ERR_FORMAT, "%s: weight_map entry '%s' is not a plain file name", idx, key);
            break;
        }
        names[nfiles++] = (char *)fn;
    }
    if (rc == OSP_OK) {
        qsort(names, nfiles, sizeof *names, cmp_str);
        char path[4096];
        for (size_t i = 0; i < nfiles && rc == OSP_OK; i++) {
            if (i > 0 && strcmp(names[i], names[i - 1]) == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            rc = add_file(st, path);
        }
    }
    if (rc == OSP_OK) rc = finish(st);
    if (rc == OSP_OK) {
        json_object_foreach(wm, key, v) {
            const osp_st_tensor *t = osp_st_find(st, key);
            if (!t || strcmp(strrchr(st->files[t->file].path, '/') + 1, json_string_value(v)) != 0) {
                rc = osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is listed in %s but missing from it",
                             idx, key, json_string_value(v));
                break;
            }
        }
    }
    free(names);
    json_decref(root);
    return rc;
}

osp_status osp_st_open_dir(const char *dir, osp_st **out) {
    *out = NULL;
    char path[4096];
    osp_st *st = calloc(1, sizeof *st);
    if (!st) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_status rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        rc = open_index(st, dir, path);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (file_exists(path)) {
            rc = add_file(st, path);
        } else { /* any *.safetensors (e.g. MLX weights.safetensors) */
            DIR *d = opendir(dir);
            rc = d ? OSP_OK : osp_err(OSP_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
            struct dirent *de;
            while (rc == OSP_OK && d && (de = readdir(d))) {
                size_t l = strlen(de->d_name);
                if (l > 12 && strcmp(de->d_name + l - 12, ".safetensors") == 0) {
                    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
                    rc = add_file(st, path);
                }
            }
            if (d) closedir(d);
            if (rc == OSP_OK && st->n_files == 0)
                rc = osp_err(OSP_ERR_IO, "%s: no model.safetensors or *.safetensors files", dir);
        }
        if (rc == OSP_OK) rc = finish(st);
    }
    if (rc != OSP_OK) {
        osp_st_close(st);
        return rc;
    }
    *out = st;
    return OSP_OK;
}

void osp_st_close(osp_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map && !st->files[i].borrowed) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    free(st);
}

const osp_st_tensor *osp_st_find(const osp_st *st, const char *name) {
    osp_st_tensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof key, cmp_tensor_name);
}
