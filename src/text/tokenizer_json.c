/* A validating pull parser for tokenizer.json: the loader walks the file
 * once, reading the vocabulary and merges straight into its tables (a DOM
 * of a 33 MB file costs more than the whole load). Small subtrees (the
 * pipeline settings) are handed to jansson by span. Every value is fully
 * validated, also when skipped, so a malformed or truncated file is always
 * an error naming the byte offset. */
#include <string.h>
#include "text/tokenizer_internal.h"

osp_status tkj_error(tk_json *j, const char *what) {
    if (j->p >= j->end)
        return osp_err(OSP_ERR_FORMAT, "%s: malformed JSON: unexpected end of file at byte %zu "
                                       "(truncated file?)",
                       j->name, (size_t)(j->end - j->beg));
    return osp_err(OSP_ERR_FORMAT, "%s: malformed JSON at byte %zu: %s", j->name,
                   (size_t)(j->p - j->beg), what);
}

void tkj_ws(tk_json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

osp_status tkj_expect(tk_json *j, char c) {
    tkj_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char m[32];
        snprintf(m, sizeof m, "expected '%c'", c);
        return tkj_error(j, m);
    }
    j->p++;
    return OSP_OK;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *v = x;
    return 1;
}

/* Parse a string at j->p ('"' expected); decoded into out when out != NULL. */
static osp_status string_impl(tk_json *j, tk_buf *out) {
    tkj_ws(j);
    if (j->p >= j->end || *j->p != '"') return tkj_error(j, "expected a string");
    j->p++;
    if (out) out->n = 0;
    for (;;) {
        const char *s = j->p;
        for (;;) {
            while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p - 0x20u < 0x60u) j->p++;
            if (j->p >= j->end || (unsigned char)*j->p < 0x80) break;
            int k = tk_utf8_seq_len(j->p, (size_t)(j->end - j->p)); /* raw UTF-8 is checked here */
            if (k <= 0) return tkj_error(j, "string is not valid UTF-8");
            j->p += k;
        }
        if (out && j->p > s) OSP_TRY(tk_buf_put(out, s, (size_t)(j->p - s)));
        if (j->p >= j->end) return tkj_error(j, "unterminated string");
        char c = *j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if ((unsigned char)c < 0x20) return tkj_error(j, "control character in string");
        /* escape */
        if (j->end - j->p < 2) {
            j->p = j->end;
            return tkj_error(j, "unterminated string");
        }
        char e = j->p[1];
        char ch;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (j->end - j->p < 6) {
                j->p = j->end;
                return tkj_error(j, "unterminated string");
            }
            if (!hex4(j->p + 2, &cp)) return tkj_error(j, "bad \\u escape");
            j->p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !hex4(j->p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return tkj_error(j, "lone surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                j->p += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return tkj_error(j, "lone surrogate in \\u escape");
            }
            if (out) {
                char b[4];
                OSP_TRY(tk_buf_put(out, b, (size_t)tk_u8enc(cp, b)));
            }
            continue;
        }
        default: return tkj_error(j, "bad escape in string");
        }
        if (out) OSP_TRY(tk_buf_put(out, &ch, 1));
        j->p += 2;
    }
    return OSP_OK;
}

osp_status tkj_string(tk_json *j, tk_buf *out) {
    OSP_TRY(string_impl(j, out));
    if (!out->p) OSP_TRY(tk_buf_reserve(out, 0));
    out->p[out->n] = 0;
    return OSP_OK;
}

static osp_status number(tk_json *j) {
    const char *p = j->p;
    if (p < j->end && *p == '-') p++;
    if (p >= j->end || *p < '0' || *p > '9') {
        j->p = p;
        return tkj_error(j, "bad number");
    }
    if (*p == '0') p++;
    else while (p < j->end && *p >= '0' && *p <= '9') p++;
    if (p < j->end && *p == '.') {
        p++;
        if (p >= j->end || *p < '0' || *p > '9') {
            j->p = p;
            return tkj_error(j, "bad number");
        }
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->end && (*p == '+' || *p == '-')) p++;
        if (p >= j->end || *p < '0' || *p > '9') {
            j->p = p;
            return tkj_error(j, "bad number");
        }
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    j->p = p;
    return OSP_OK;
}

osp_status tkj_int(tk_json *j, int64_t *v) {
    tkj_ws(j);
    const char *s = j->p;
    OSP_TRY(number(j));
    int64_t x = 0;
    int neg = 0;
    const char *p = s;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; p < j->p; p++) {
        if (*p < '0' || *p > '9') {
            j->p = s;
            return tkj_error(j, "expected an integer");
        }
        if (x > (INT64_MAX - 9) / 10) {
            j->p = s;
            return tkj_error(j, "integer out of range");
        }
        x = x * 10 + (*p - '0');
    }
    *v = neg ? -x : x;
    return OSP_OK;
}

static osp_status literal(tk_json *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) {
        if ((size_t)(j->end - j->p) < n && memcmp(j->p, w, (size_t)(j->end - j->p)) == 0) j->p = j->end;
        return tkj_error(j, "unexpected character");
    }
    j->p += n;
    return OSP_OK;
}

int tkj_obj_next(tk_json *j, int *first, tk_buf *key, osp_status *st) {
    tkj_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    if (!*first) {
        if ((*st = tkj_expect(j, ',')) != OSP_OK) return -1;
    }
    *first = 0;
    if ((*st = key ? tkj_string(j, key) : string_impl(j, NULL)) != OSP_OK) return -1;
    if ((*st = tkj_expect(j, ':')) != OSP_OK) return -1;
    return 1;
}

int tkj_arr_next(tk_json *j, int *first, osp_status *st) {
    tkj_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 0;
    }
    if (!*first) {
        if ((*st = tkj_expect(j, ',')) != OSP_OK) return -1;
    }
    *first = 0;
    tkj_ws(j);
    if (j->p >= j->end) {
        *st = tkj_error(j, "unterminated array");
        return -1;
    }
    return 1;
}

/* Iterative skip with an explicit stack of open brackets. */
osp_status tkj_skip(tk_json *j) {
    char stack[512];
    int depth = 0;
    int first = 1; /* at the first member of the innermost container */
    for (;;) {
        tkj_ws(j);
        if (j->p >= j->end) return tkj_error(j, "unexpected end");
        if (depth > 0) {
            char open = stack[depth - 1];
            char close = open == '{' ? '}' : ']';
            if (*j->p == close) {
                j->p++;
                depth--;
                first = 0;
                if (depth == 0) return OSP_OK;
                continue;
            }
            if (!first) OSP_TRY(tkj_expect(j, ','));
            if (open == '{') {
                OSP_TRY(string_impl(j, NULL));
                OSP_TRY(tkj_expect(j, ':'));
            }
            tkj_ws(j);
            if (j->p >= j->end) return tkj_error(j, "unexpected end");
        }
        char c = *j->p;
        if (c == '{' || c == '[') {
            if (depth == (int)sizeof stack) return tkj_error(j, "nesting too deep");
            stack[depth++] = c;
            j->p++;
            first = 1;
            continue;
        }
        if (c == '"') OSP_TRY(string_impl(j, NULL));
        else if (c == 't') OSP_TRY(literal(j, "true"));
        else if (c == 'f') OSP_TRY(literal(j, "false"));
        else if (c == 'n') OSP_TRY(literal(j, "null"));
        else if (c == '-' || (c >= '0' && c <= '9')) OSP_TRY(number(j));
        else return tkj_error(j, "unexpected character");
        first = 0;
        if (depth == 0) return OSP_OK;
    }
}
