/* model/arch: the architectures osprey runs. */
#include <string.h>
#include "arch.h"

extern const osp_arch_ops osp_arch_llama, osp_arch_qwen2, osp_arch_qwen3, osp_arch_gemma3, osp_arch_gemma4;
extern const osp_arch_ops osp_arch_bert, osp_arch_xlmr, osp_arch_xlmr_cls;

static const osp_arch_ops *const ALL[] = {&osp_arch_llama, &osp_arch_qwen2, &osp_arch_qwen3, &osp_arch_gemma3,
                                          &osp_arch_gemma4, &osp_arch_bert, &osp_arch_xlmr, &osp_arch_xlmr_cls};

const osp_arch_ops *osp_arch_find(const char *hf_name, const char *model_type, const char **canonical) {
    for (size_t i = 0; i < sizeof ALL / sizeof *ALL; i++)
        for (int k = 0; ALL[i]->hf_names[k]; k++)
            if ((hf_name && !strcmp(hf_name, ALL[i]->hf_names[k])) ||
                (!hf_name && model_type && ALL[i]->model_types[k] && !strcmp(model_type, ALL[i]->model_types[k]))) {
                *canonical = ALL[i]->hf_names[k];
                return ALL[i];
            }
    return NULL;
}
