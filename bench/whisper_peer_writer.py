#!/usr/bin/env python3
# Copied from ../shared/peers/whisper/ggml_whisper_writer.py (unchanged below); used by bench/whisper_peer.sh.
"""numpy-only writer of whisper.cpp's legacy ggml model file (the format of models/convert-pt-to-ggml.py,
read by src/whisper.cpp whisper_model_load), with random weights and the real Whisper shapes.

Layout (all little-endian int32 / float32):
  magic 0x67676d6c
  hparams: n_vocab n_audio_ctx n_audio_state n_audio_head n_audio_layer
           n_text_ctx n_text_state n_text_head n_text_layer n_mels ftype(1 = f16)
  mel filters: n_mel, n_fft(=201), then n_mel*201 float32 (Slaney mel, as librosa/whisper's mel_filters.npz)
  vocab: n (=50257 base BPE tokens), then n x (len, bytes); whisper.cpp adds the special/language/timestamp
         tokens itself up to n_vocab ("adding N extra tokens")
  tensors: n_dims, len(name), ttype (0 f32, 1 f16), ne[0..n_dims) (innermost first = PyTorch shape reversed),
           name, raw data.  2-D matrices and conv kernels f16; biases, norms, positional embeddings f32;
           conv biases as [n_state, 1].

Weights: N(0, 0.02) everywhere (norm weights 1, biases 0, encoder positional embedding = Whisper's sinusoids),
EXCEPT a deterministic "script" in the decoder so that greedy decoding emits a chosen token sequence and the
number of decoded tokens is known (speed does not depend on weight values; token count does):
  decoder.positional_embedding[q] = ALPHA * v(target(q)) and token_embedding[target] = BETA * v(target), with
  v(.) orthonormal zero-mean directions, so the residual stream is dominated by the position term and the
  logits at position q peak at target(q):
    q = 2            -> <|0.00|>          (first sampled token; prompt is SOT, <|en|>, <|transcribe|>)
    q = 3 .. N+2     -> the N text tokens  (default: the 25 real multilingual-vocab ids of jfk.wav's transcript,
                                            repeated/truncated to N)
    q = N+3          -> <|T_END|>          (closing timestamp; end of window)
    q >= N+4 (and 0,1) -> <|endoftext|>
  So one 30 s window decodes: 1 prompt pass (3 tokens) + N+1 single-token passes (+1 more, the EOT step, when
  the window is not the last one). The 25 JFK ids get their real strings so the transcript reads as the real
  sentence (other vocab entries are placeholders "<id>").

Usage: python3 ggml_whisper_writer.py --preset tiny|base|small|medium|large-v3 --out FILE
                                      [--n-text 25] [--t-end 11.0] [--seed 0]
"""
import argparse
import struct
import sys
import time

import numpy as np

PRESETS = {
    #            n_vocab n_audio_state heads layers n_mels
    "tiny":     (51865, 384, 6, 4, 80),
    "base":     (51865, 512, 8, 6, 80),
    "small":    (51865, 768, 12, 12, 80),
    "medium":   (51865, 1024, 16, 24, 80),
    "large-v3": (51866, 1280, 20, 32, 128),
}
N_AUDIO_CTX, N_TEXT_CTX = 1500, 448
N_BASE_VOCAB = 50257  # multilingual.tiktoken ranks 0..50256

JFK_IDS = [400, 370, 452, 7177, 6280, 11, 1029, 406, 437, 428, 1941, 393, 360, 337, 291, 11,
           1029, 437, 291, 393, 360, 337, 428, 1941, 13]
JFK_WORDS = [" And", " so", " my", " fellow", " Americans", ",", " ask", " not", " what", " your", " country",
             " can", " do", " for", " you", ",", " ask", " what", " you", " can", " do", " for", " your",
             " country", "."]

STD = 0.02
ALPHA = 1000.0  # norm of the positional "script" vector (dominates the decoder's residual stream)
BETA = 1.0      # norm of a target token's embedding row


def mel_filters(n_mels, sr=16000, n_fft=400):
    """Slaney-style mel filterbank (librosa.filters.mel defaults: htk=False, norm='slaney')."""
    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        f_sp = 200.0 / 3
        mels = f / f_sp
        min_log_hz = 1000.0
        min_log_mel = min_log_hz / f_sp
        logstep = np.log(6.4) / 27.0
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)

    def mel_to_hz(m):
        m = np.asarray(m, dtype=np.float64)
        f_sp = 200.0 / 3
        freqs = f_sp * m
        min_log_hz = 1000.0
        min_log_mel = min_log_hz / f_sp
        logstep = np.log(6.4) / 27.0
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)

    n_freq = n_fft // 2 + 1
    fftfreqs = np.linspace(0, sr / 2, n_freq)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    w = np.zeros((n_mels, n_freq))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        w[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
    w *= enorm[:, None]
    return w.astype(np.float32)


def sinusoids(length, channels, max_timescale=10000):
    inc = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


class Writer:
    def __init__(self, f, rng):
        self.f, self.rng, self.n, self.bytes = f, rng, 0, 0

    def tensor(self, name, data):
        data = np.ascontiguousarray(data)
        ttype = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}[data.dtype]
        nb = name.encode()
        self.f.write(struct.pack("<iii", data.ndim, len(nb), ttype))
        for d in reversed(data.shape):
            self.f.write(struct.pack("<i", d))
        self.f.write(nb)
        data.tofile(self.f)
        self.n += 1
        self.bytes += data.nbytes

    def rand16(self, *shape):
        return (self.rng.standard_normal(shape, dtype=np.float32) * STD).astype(np.float16)

    def lin(self, name, n_out, n_in, bias=True):
        self.tensor(name + ".weight", self.rand16(n_out, n_in))
        if bias:
            self.tensor(name + ".bias", np.zeros(n_out, np.float32))

    def ln(self, name, n):
        self.tensor(name + ".weight", np.ones(n, np.float32))
        self.tensor(name + ".bias", np.zeros(n, np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-text", type=int, default=25, help="text tokens emitted per 30 s window")
    ap.add_argument("--t-end", type=float, default=11.0, help="closing timestamp (s) of every window")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    n_vocab, n_state, n_head, n_layer, n_mels = PRESETS[a.preset]
    rng = np.random.default_rng(a.seed)
    t0 = time.time()

    # token ids as whisper.cpp computes them for a multilingual vocab
    n_langs = n_vocab - 51765 - 1
    dt = n_langs - 98
    tok_eot, tok_sot = 50257, 50258
    tok_beg = 50363 + 1 + dt  # 50364 (v2 vocab), 50365 (large-v3)
    n = a.n_text
    assert 1 <= n <= N_TEXT_CTX // 2 - 8
    text = [JFK_IDS[i % len(JFK_IDS)] for i in range(n)]
    t_a = tok_beg  # <|0.00|>
    t_b = tok_beg + int(round(a.t_end / 0.02))
    assert t_b < n_vocab

    def target(q):
        if q == 2:
            return t_a
        if 3 <= q <= n + 2:
            return text[q - 3]
        if q == n + 3:
            return t_b
        return tok_eot

    targets = sorted(set([t_a, t_b, tok_eot] + text))
    g = rng.standard_normal((n_state, len(targets)))
    g -= g.mean(axis=0, keepdims=True)
    q_, _ = np.linalg.qr(g)  # orthonormal, zero-mean columns
    dirs = {t: q_[:, i].astype(np.float32) for i, t in enumerate(targets)}

    with open(a.out, "wb") as f:
        f.write(struct.pack("<i", 0x67676D6C))
        f.write(struct.pack("<11i", n_vocab, N_AUDIO_CTX, n_state, n_head, n_layer,
                            N_TEXT_CTX, n_state, n_head, n_layer, n_mels, 1))
        filt = mel_filters(n_mels)
        f.write(struct.pack("<ii", *filt.shape))
        filt.tofile(f)
        words = {i: w for i, w in zip(JFK_IDS, JFK_WORDS)}
        words[220] = " "
        f.write(struct.pack("<i", N_BASE_VOCAB))
        for i in range(N_BASE_VOCAB):
            b = words.get(i, "<%d>" % i).encode()
            f.write(struct.pack("<i", len(b)))
            f.write(b)

        w = Writer(f, rng)
        # encoder
        w.tensor("encoder.positional_embedding", sinusoids(N_AUDIO_CTX, n_state))
        w.tensor("encoder.conv1.weight", w.rand16(n_state, n_mels, 3))
        w.tensor("encoder.conv1.bias", np.zeros((n_state, 1), np.float32))
        w.tensor("encoder.conv2.weight", w.rand16(n_state, n_state, 3))
        w.tensor("encoder.conv2.bias", np.zeros((n_state, 1), np.float32))
        for i in range(n_layer):
            p = "encoder.blocks.%d." % i
            w.lin(p + "attn.query", n_state, n_state)
            w.lin(p + "attn.key", n_state, n_state, bias=False)
            w.lin(p + "attn.value", n_state, n_state)
            w.lin(p + "attn.out", n_state, n_state)
            w.ln(p + "attn_ln", n_state)
            w.lin(p + "mlp.0", 4 * n_state, n_state)
            w.lin(p + "mlp.2", n_state, 4 * n_state)
            w.ln(p + "mlp_ln", n_state)
        w.ln("encoder.ln_post", n_state)
        # decoder
        te = w.rand16(n_vocab, n_state)
        for t in targets:
            te[t] = (BETA * dirs[t]).astype(np.float16)
        w.tensor("decoder.token_embedding.weight", te)
        del te
        pe = np.stack([ALPHA * dirs[target(q)] for q in range(N_TEXT_CTX)]).astype(np.float32)
        w.tensor("decoder.positional_embedding", pe)
        for i in range(n_layer):
            p = "decoder.blocks.%d." % i
            for att in ("attn", "cross_attn"):
                w.lin(p + att + ".query", n_state, n_state)
                w.lin(p + att + ".key", n_state, n_state, bias=False)
                w.lin(p + att + ".value", n_state, n_state)
                w.lin(p + att + ".out", n_state, n_state)
                w.ln(p + att + "_ln", n_state)
            w.lin(p + "mlp.0", 4 * n_state, n_state)
            w.lin(p + "mlp.2", n_state, 4 * n_state)
            w.ln(p + "mlp_ln", n_state)
        w.ln("decoder.ln", n_state)

    script = "".join(JFK_WORDS[i % len(JFK_WORDS)] for i in range(n))
    print("wrote %s: preset %s, %d tensors, %.1f MB of tensor data, %.1f s; decoder script per window: "
          "<|0.00|> + %d text tokens + <|%.2f|> (+ <|endoftext|>): %r"
          % (a.out, a.preset, w.n, w.bytes / 1e6, time.time() - t0, n, a.t_end, script), file=sys.stderr)


if __name__ == "__main__":
    main()
