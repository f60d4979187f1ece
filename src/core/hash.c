#include "core/hash.h"
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct osp_sha256 {
    EVP_MD_CTX *ctx;
};

osp_sha256 *osp_sha256_new(void) {
    osp_sha256 *h = malloc(sizeof *h);
    if (!h) return NULL;
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(h->ctx);
        free(h);
        return NULL;
    }
    return h;
}

void osp_sha256_add(osp_sha256 *h, const void *p, size_t n) {
    if (n) EVP_DigestUpdate(h->ctx, p, n);
}

void osp_sha256_end(osp_sha256 *h, unsigned char out[32]) {
    unsigned int n = 32;
    EVP_DigestFinal_ex(h->ctx, out, &n);
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

void osp_hex(const unsigned char *p, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) out[2 * i] = d[p[i] >> 4], out[2 * i + 1] = d[p[i] & 15];
    out[2 * n] = 0;
}

osp_status osp_sha256_file(const char *path, char out[65], int64_t *bytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return osp_err(OSP_ERR_IO, "%s: %s", path, strerror(errno));
    enum { CHUNK = 4 << 20 };
    unsigned char *buf = malloc(CHUNK);
    osp_sha256 *h = osp_sha256_new();
    if (!buf || !h) {
        free(buf);
        if (h) osp_sha256_end(h, (unsigned char[32]){0});
        close(fd);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            osp_sha256_end(h, (unsigned char[32]){0});
            close(fd);
            return osp_err(OSP_ERR_IO, "%s: %s", path, strerror(e));
        }
        if (r == 0) break;
        osp_sha256_add(h, buf, (size_t)r);
        total += r;
    }
    unsigned char dg[32];
    osp_sha256_end(h, dg);
    osp_hex(dg, 32, out);
    free(buf);
    close(fd);
    if (bytes) *bytes = total;
    return OSP_OK;
}
