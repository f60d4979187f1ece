/* RoPE, rotate-half (NeoX) layout: pair (i, i + D/2) turns by pos·inv_freq[i].
 * The inverse frequencies are what Hugging Face's rope init functions compute
 * when a checkpoint is loaded: f32 tensor arithmetic, with the config's Python
 * floats (double) rounded to f32 where they meet a tensor, and nothing rounded
 * to the checkpoint's dtype (transformers, MLX and llama.cpp all keep them in
 * f32; the goldens are made that way). */
#include <math.h>
#include "model.h"

void osp_rope_inv_freq(const osp_rope *r, int32_t D, float *inv) {
    for (int32_t i = 0; i < D / 2; i++) inv[i] = 1.0f / powf(r->theta, (float)(2 * i) / (float)D);
    if (r->type == OSP_ROPE_PROPORTIONAL) { /* rotate the first int(partial·D // 2) pairs, keep the rest */
        int32_t n_rot = (int32_t)floor(r->partial * (double)D / 2.0);
        for (int32_t i = 0; i < D / 2; i++) inv[i] = i < n_rot ? inv[i] / r->factor : 0.0f;
    } else if (r->type == OSP_ROPE_LINEAR) {
        for (int32_t i = 0; i < D / 2; i++) inv[i] /= r->factor;
    } else if (r->type == OSP_ROPE_LLAMA3) {
        const float two_pi = (float)(2.0 * 3.14159265358979323846);
        const float low_wl = (float)((double)r->orig_max_pos / r->low_freq_factor);
        const float high_wl = (float)((double)r->orig_max_pos / r->high_freq_factor);
        const float lff = (float)r->low_freq_factor, span = (float)(r->high_freq_factor - r->low_freq_factor);
        for (int32_t i = 0; i < D / 2; i++) {
            float wl = two_pi / inv[i];
            if (wl > low_wl) {
                inv[i] = inv[i] / r->factor;
            } else if (wl >= high_wl) { /* medium band: blend */
                float smooth = ((float)r->orig_max_pos / wl - lff) / span;
                inv[i] = (1.0f - smooth) * inv[i] / r->factor + smooth * inv[i];
            }
        }
    }
}
