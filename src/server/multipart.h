/* server/multipart: a multipart/form-data body (RFC 7578) split into its
 * parts, in place: every pointer points into the body. Pure; fuzzed. */
#ifndef OSP_SRV_MULTIPART_H
#define OSP_SRV_MULTIPART_H

#include <stddef.h>

typedef struct srv_part {
    const char *name, *filename; /* NUL-terminated copies in the parser's own buffer; filename may be NULL */
    const char *data;            /* the part's bytes (not NUL-terminated) */
    size_t len;
} srv_part;

#define SRV_MAX_PARTS 32

typedef struct srv_form {
    srv_part parts[SRV_MAX_PARTS];
    int n;
    char names[SRV_MAX_PARTS][2][256];
} srv_form;

/* Parse `body` by the boundary of `content_type`. 0 on success; otherwise
 * -1 with *err set to a message a client can act on. */
int srv_multipart_parse(const char *content_type, const char *body, size_t len, srv_form *f, const char **err);
/* The first part named `name`, or NULL. */
const srv_part *srv_form_get(const srv_form *f, const char *name);

#endif
