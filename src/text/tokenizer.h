/* text/tokenizer: Hugging Face tokenizer.json tokenizers (BPE, byte-level
 * and SentencePiece-style, WordPiece, Unigram) and tiktoken rank files,
 * reproduced exactly.
 *
 * A loaded osp_tokenizer is immutable and may be shared by threads; every
 * call takes its scratch from the call itself (the pre-token cache inside is
 * guarded by a try-lock, so a contended call simply runs without it).
 *
 * Encode runs the Hugging Face pipeline in its order:
 *   added tokens (non-normalized ones on the raw text, longest match first)
 *   -> normalizer (per remaining piece) -> added tokens (normalized ones)
 *   -> pre-tokenizer -> model -> post-processor (only with add_special).
 * Decode runs the tokenizer.json decoder over the token strings ("decode"
 * here never applies transformers' clean_up_tokenization_spaces unless the
 * caller asks with OSP_DECODE_CLEANUP_SPACES).
 *
 * Supported (anything else in the file is refused with OSP_ERR_UNSUPPORTED
 * naming it, never approximated):
 *   model         BPE (vocab, merges as "a b" or ["a","b"], unk_token,
 *                 fuse_unk, byte_fallback, ignore_merges,
 *                 continuing_subword_prefix, end_of_word_suffix; dropout
 *                 must be null or 0); WordPiece (unk_token,
 *                 continuing_subword_prefix, max_input_chars_per_word:
 *                 tokenizer_wordpiece.c); Unigram ([[piece, score], ...],
 *                 unk_id, byte_fallback; Viterbi: tokenizer_unigram.c)
 *   normalizer    NFC NFD NFKC NFKD Lowercase Replace Prepend Strip
 *                 BertNormalizer Precompiled Sequence
 *   pre_tokenizer ByteLevel Split Metaspace Digits Punctuation Whitespace
 *                 WhitespaceSplit BertPreTokenizer Sequence
 *   post_processor TemplateProcessing ByteLevel RobertaProcessing
 *                 BertProcessing Sequence (ids only; no offsets are kept)
 *   decoder       ByteLevel ByteFallback Fuse Strip Replace Metaspace WordPiece
 *                 Sequence
 * `truncation` and `padding` are batch-shaping options of the reference
 * library, not tokenization: they are ignored.
 *
 * tokenizer_config.json (optional, next to tokenizer.json): bos_token,
 * eos_token, pad_token, unk_token (a string or an AddedToken object),
 * clean_up_tokenization_spaces, and add_bos_token / add_eos_token. The side
 * the config states becomes [bos if add_bos] $A [eos if add_eos], as
 * transformers' Llama and Gemma tokenizers rebuild it; a side it does not
 * state keeps the file's post-processor (Qwen3-Embedding: add_bos_token
 * false, and the file's <|endoftext|> after the text).
 *
 * Ids are int32 in [0, vocab_size). Text is UTF-8; encode refuses invalid
 * UTF-8 input (OSP_ERR_INVALID); decode output is always valid UTF-8.
 */
#ifndef OSP_TOKENIZER_H
#define OSP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "osprey.h"

typedef struct osp_tokenizer osp_tokenizer;

typedef struct osp_tokenizer_info {
    int32_t vocab_size;   /* max id + 1 (model vocab and added tokens) */
    int32_t bos_id;       /* -1 when none */
    int32_t eos_id;       /* -1 when none */
    int32_t pad_id;       /* -1 when none */
    int32_t unk_id;       /* -1 when none */
    int add_bos, add_eos; /* what encode(add_special=1) puts around the text */
    int clean_up_tokenization_spaces; /* from tokenizer_config.json (0 if absent) */
} osp_tokenizer_info;

/* Load from a folder holding tokenizer.json (+ tokenizer_config.json), a
 * Hugging Face cache repo folder (models--ORG--NAME), or the path of a
 * tokenizer.json file (its sibling tokenizer_config.json is read too). */
osp_status osp_tokenizer_load(const char *path, osp_tokenizer **out);

/* Load from memory: the tokenizer.json text and, optionally (NULL, 0), the
 * tokenizer_config.json text. `name` is used in error messages. */
osp_status osp_tokenizer_load_json(const char *json, size_t json_len, const char *config,
                                   size_t config_len, const char *name, osp_tokenizer **out);

/* Load a tiktoken rank file (lines "base64(bytes) rank"): a byte-level BPE
 * whose merge priority is the rank of the merged bytes, with `pattern` as
 * the split regex (NULL: the GPT-2 regex) and `specials` appended as
 * special added tokens with ids max_rank+1, max_rank+2, ... in order (the
 * way openai/whisper builds its encodings). Decode maps ids back to their
 * bytes. */
osp_status osp_tokenizer_load_tiktoken(const char *path, const char *pattern,
                                       const char *const *specials, int32_t n_specials,
                                       osp_tokenizer **out);

void osp_tokenizer_free(osp_tokenizer *t);

const osp_tokenizer_info *osp_tokenizer_get_info(const osp_tokenizer *t);

/* Encode `len` bytes of UTF-8 text. With add_special, the post-processor
 * adds its special tokens (e.g. <bos>). Special-token strings inside the
 * text are always matched (as Hugging Face does by default).
 * The ids go to the caller's buffer of `cap` entries; *n_ids receives the
 * count. If cap is too small, returns OSP_ERR_RANGE with *n_ids set to the
 * count needed (nothing else is written past cap). */
osp_status osp_tokenizer_encode(const osp_tokenizer *t, const char *text, size_t len,
                                int add_special, int32_t *ids, size_t cap, size_t *n_ids);
/* Same, returning a buffer from osp_malloc (free it with osp_free). */
osp_status osp_tokenizer_encode_alloc(const osp_tokenizer *t, const char *text, size_t len,
                                      int add_special, int32_t **ids, size_t *n_ids);

enum {
    OSP_DECODE_SKIP_SPECIAL = 1u << 0,   /* drop special added tokens */
    OSP_DECODE_CLEANUP_SPACES = 1u << 1, /* transformers' clean_up_tokenization (" ." -> ".", ...) */
};
/* Decode ids to text: a NUL-terminated buffer from osp_malloc (free with
 * osp_free), its length in *len (may be NULL). Ids outside [0, vocab_size)
 * are OSP_ERR_RANGE; ids inside the range with no token are skipped, as
 * Hugging Face does. */
osp_status osp_tokenizer_decode(const osp_tokenizer *t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* Id of a token string (added tokens first, then the model vocab), or -1. */
int32_t osp_tokenizer_token_id(const osp_tokenizer *t, const char *s, size_t len);
/* The vocabulary string of an id (not NUL-terminated; *len its length), or
 * NULL for ids with no token. Byte-level vocabularies spell bytes with the
 * GPT-2 byte-to-unicode alphabet ("Ġ" for a space). */
const char *osp_tokenizer_token_text(const osp_tokenizer *t, int32_t id, size_t *len);
/* 1 if id is a special added token (skipped by OSP_DECODE_SKIP_SPECIAL). */
int osp_tokenizer_is_special(const osp_tokenizer *t, int32_t id);

#endif
