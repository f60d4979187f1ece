/* text/chat_template: a model's chat template, rendered the way Hugging Face
 * transformers' apply_chat_template renders it.
 *
 * Where the template comes from (first found):
 *   1. an explicit file (--chat-template FILE);
 *   2. MODEL/chat_template.jinja (transformers 5 layout);
 *   3. MODEL/chat_template.json's "chat_template";
 *   4. MODEL/tokenizer_config.json's "chat_template": a string, or a list of
 *      {"name", "template"} of which "tool_use" is picked when tools are
 *      given (and it exists), else "default".
 * bos_token and eos_token come from tokenizer_config.json (a string or an
 * AddedToken object {"content": ...}); special_tokens_map.json fills in a
 * token that tokenizer_config.json does not mention. MODEL may be a folder
 * holding only these files, or a Hugging Face cache repo folder
 * (models--ORG--NAME).
 *
 * Rendering passes exactly the variables transformers passes: messages,
 * tools (None when absent), documents (None), add_generation_prompt,
 * bos_token and eos_token (each only when not null), then the caller's
 * extra variables (e.g. enable_thinking), which win on a name clash.
 *
 * A loaded template is immutable: render it from any number of threads.
 */
#ifndef OSP_CHAT_TEMPLATE_H
#define OSP_CHAT_TEMPLATE_H

#include <jansson.h>
#include "core/core.h"
#include "text/jinja.h"

typedef struct osp_chat_template osp_chat_template;

/* Load from a model folder; template_file (NULL = none) replaces the
 * folder's template but bos/eos are still read from the folder when it has
 * a tokenizer_config.json. model_dir may be NULL when template_file is set. */
osp_status osp_chat_template_load(const char *model_dir, const char *template_file, osp_chat_template **out);

/* From template source; bos_token / eos_token may be NULL (not defined). */
osp_status osp_chat_template_new(const char *source, size_t len, const char *bos_token, const char *eos_token,
                                 osp_chat_template **out);

void osp_chat_template_free(osp_chat_template *ct);

const char *osp_chat_template_bos(const osp_chat_template *ct); /* NULL when not set */
const char *osp_chat_template_eos(const osp_chat_template *ct);
/* The source text of every template it holds, joined by newlines (e.g. to
 * recognise a model family's markers). */
const char *osp_chat_template_source(const osp_chat_template *ct);

/* Render a conversation. messages: a JSON array; tools: a JSON array or
 * NULL; extra: a JSON object of additional variables or NULL; opt: limits
 * and clock (NULL = defaults). *out is NUL-terminated, *out_len bytes,
 * from osp_malloc (free with osp_free). Template errors (including
 * raise_exception) are OSP_ERR_INVALID with the template's message. */
osp_status osp_chat_template_render(const osp_chat_template *ct, const json_t *messages, const json_t *tools,
                                    int add_generation_prompt, const json_t *extra,
                                    const osp_jinja_options *opt, char **out, size_t *out_len);

#endif
