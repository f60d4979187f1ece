/* RoPE, rotate-half (NeoX) layout: pair (i, i + D/2) turns by pos·inv_freq[i].
 * Frequencies follow Hugging Face's rope init functions, computed in f32,
 * then rounded to the checkpoint dtype as HF's buffer cast does. */
#include <math.h>
#include "model.h"

void osp_rope_inv_freq(const osp_rope *r, int32_t D, float *inv) {
    for (int32_t i = 0; i < D / 2; i++) inv[i] = 1.0f / powf(r->theta, (float)(2 * i) / (float)D);
    if (r->type == OSP_ROPE_PROPORTIONAL) { /* rotate the first int(partial·D/2) pairs, keep the rest */
        int32_t n_rot = (int32_t)(r->partial * (float)D / 2.0f);
        for (int32_t i = 0; i < D / 2; i++) inv[i] = i < n_rot ? inv[i] / r->factor : 0.0f;
    } else if (r->type == OSP_ROPE_LINEAR) {
        for (int32_t i = 0; i < D / 2; i++) inv[i] /= r->factor;
    } else if (r->type == OSP_ROPE_LLAMA3) {
        const float pi = 3.14159265358979323846f;
        float low_wl = (float)r->orig_max_pos / r->low_freq_factor;
        float high_wl = (float)r->orig_max_pos / r->high_freq_factor;
        for (int32_t i = 0; i < D / 2; i++) {
            float wl = 2.0f * pi / inv[i];
            if (wl > low_wl) {
                inv[i] = inv[i] / r->factor;
            } else if (wl >= high_wl) { /* medium band: blend */
                float smooth = ((float)r->orig_max_pos / wl - r->low_freq_factor) /
                               (r->high_freq_factor - r->low_freq_factor);
                inv[i] = (1.0f - smooth) * inv[i] / r->factor + smooth * inv[i];
            }
        }
    }
    for (int32_t i = 0; i < D / 2; i++) {
        if (r->round_dtype == OSP_DT_BF16) inv[i] = osp_bf16_to_f32(osp_f32_to_bf16(inv[i]));
        else if (r->round_dtype == OSP_DT_F16) inv[i] = osp_f16_to_f32(osp_f32_to_f16(inv[i]));
    }
}

void osp_rope_apply(float *x, int32_t D, const float *inv, int32_t pos) {
    int32_t h = D / 2;
    for (int32_t i = 0; i < h; i++) {
        float a = (float)pos * inv[i];
        float c = cosf(a), s = sinf(a);
        float x1 = x[i], x2 = x[i + h];
        x[i] = x1 * c - x2 * s;
        x[i + h] = x2 * c + x1 * s;
    }
}
