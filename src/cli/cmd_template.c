/* osprey template: render a model's chat template for a conversation and
 * print it exactly (no newline added). Needs only the template and the
 * bos/eos tokens: chat_template.jinja or tokenizer_config.json, or
 * --chat-template FILE. Every error is one line "osprey template: ...",
 * exit 1. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "text/chat_template.h"

static const char *USAGE =
    "usage: osprey template [--model MODEL] --messages FILE.json [--tools FILE.json] [--add-generation-prompt] "
    "[--var NAME=JSON ...] [--chat-template FILE]";

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("osprey template: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* The library's message on one line. */
static int fail_lib(void) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", osp_last_error()[0] ? osp_last_error() : "failed");
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return fail("%s", msg);
}

/* A JSON file ("-" = stdin). */
static json_t *load(const char *what, const char *path) {
    json_error_t e;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, JSON_DECODE_ANY, &e) : json_load_file(path, JSON_DECODE_ANY, &e);
    if (!j) fail("%s %s: invalid JSON at line %d: %s", what, path, e.line, e.text);
    return j;
}

int osp_cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages_path = NULL, *tools_path = NULL, *template_path = NULL;
    int add_gen = 0;
    json_t *extra = json_object();
    int rc = 1;
    json_t *messages = NULL, *tools = NULL, *doc = NULL;
    osp_chat_template *ct = NULL;
    char *out = NULL;
    if (!extra) return fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if ((!strcmp(a, "--model") || !strcmp(a, "-m")) && has_val) model = argv[++i];
        else if (!strcmp(a, "--messages") && has_val) messages_path = argv[++i];
        else if (!strcmp(a, "--tools") && has_val) tools_path = argv[++i];
        else if (!strcmp(a, "--chat-template") && has_val) template_path = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt")) add_gen = 1;
        else if (!strcmp(a, "--var") && has_val) {
            const char *spec = argv[++i], *eq = strchr(spec, '=');
            if (!eq || eq == spec) { fail("--var %s: expected NAME=JSON", spec); goto done; }
            json_error_t e;
            json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, &e);
            if (!v) {
                fail("--var %s: the value is not JSON (%s); quote strings, e.g. --var 'name=\"text\"'", spec, e.text);
                goto done;
            }
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(eq - spec), spec);
            json_object_set_new(extra, name, v);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n", USAGE);
            rc = 0;
            goto done;
        } else {
            fail("unexpected argument '%s' (%s)", a, USAGE);
            goto done;
        }
    }
    if (!messages_path) { fail("--messages FILE.json is required (%s)", USAGE); goto done; }
    if (!model && !template_path) model = osp_cli_default_model();
    if (!model && !template_path) { fail("no --model given and no bundled model found"); goto done; }
    if (!(doc = load("--messages", messages_path))) goto done;
    /* a list of messages, or {"messages": [...], "tools": [...]} */
    if (json_is_object(doc)) {
        messages = json_incref(json_object_get(doc, "messages"));
        if (!tools_path) tools = json_incref(json_object_get(doc, "tools"));
    } else {
        messages = json_incref(doc);
    }
    if (!json_is_array(messages)) {
        fail("--messages %s: expected a JSON array of messages (or an object with \"messages\")", messages_path);
        goto done;
    }
    if (tools_path && !(tools = load("--tools", tools_path))) goto done;
    if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        fail("--tools %s: expected a JSON array of tools", tools_path ? tools_path : messages_path);
        goto done;
    }
    if (osp_chat_template_load(model, template_path, &ct) != OSP_OK) { fail_lib(); goto done; }
    size_t len = 0;
    if (osp_chat_template_render(ct, messages, tools, add_gen, extra, NULL, &out, &len) != OSP_OK) {
        fail_lib();
        goto done;
    }
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) { fail("writing the output failed"); goto done; }
    rc = 0;
done:
    osp_free(out);
    osp_chat_template_free(ct);
    json_decref(messages);
    json_decref(tools);
    json_decref(doc);
    json_decref(extra);
    return rc;
}
