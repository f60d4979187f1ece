/* cli/encoder_tools: the encoders' presets of `osprey synth` (model/bert.c): real shapes and the tests' tiny ones. */
#ifndef OSP_ENCODER_TOOLS_H
#define OSP_ENCODER_TOOLS_H

#include <jansson.h>
#include "core/core.h"

/* The config.json of an encoder preset (a new reference), or NULL when name is not one. Its weights are written
 * bare (no "bert." / "roberta." prefix), as sentence-transformers saves them. */
json_t *osp_encoder_preset_config(const char *name);
/* The preset's sentence-transformers files in dir (modules.json, 1_Pooling/config.json: its pooling, Normalize);
 * none for a cross-encoder. */
osp_status osp_encoder_synth_files(const char *name, const char *dir);

#endif
