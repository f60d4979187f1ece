#!/usr/bin/env python3
"""Helpers of bench/whisper_peer.sh (numpy only).

  whisper_peer.py convert GGML OUT_DIR TIKTOKEN_GZ [--dtype bf16|f16]
      Reads whisper.cpp's ggml f16 file (bench/whisper_peer_writer.py's) and writes osprey's Hugging Face folder
      (config.json, model.safetensors, multilingual.tiktoken) with the same numbers. bf16 (osprey's production
      dtype on the CPU): every f16 tensor is first rounded to the nearest value that f16 and bf16 both hold
      exactly (bf16 rounding, then f16 rounding: at most 8 significant bits and no bit below 2^-24, so it is
      exact in both), and written back into the ggml file in place; f16: copied as is, the ggml file untouched.
      f32 tensors (biases, norms, positional embeddings) stay f32 in both.
  whisper_peer.py audio IN.wav OUT.wav SECONDS     (../shared/peers/whisper/make_audio.py)
  whisper_peer.py table WORK_DIR SIZE...           medians of the raw logs in WORK_DIR/raw and the ratios
"""
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import struct
import sys
import wave

import numpy as np


# ---------------- convert ----------------

def hf_name(n):
    """ggml (openai-whisper) tensor name -> Hugging Face WhisperForConditionalGeneration name."""
    fixed = {
        "encoder.positional_embedding": "model.encoder.embed_positions.weight",
        "decoder.positional_embedding": "model.decoder.embed_positions.weight",
        "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
    }
    if n in fixed:
        return fixed[n]
    n = re.sub(r"^encoder\.ln_post\.", "encoder.layer_norm.", n)
    n = re.sub(r"^decoder\.ln\.", "decoder.layer_norm.", n)
    n = n.replace(".blocks.", ".layers.")
    for a, b in ((".cross_attn_ln.", ".encoder_attn_layer_norm."), (".attn_ln.", ".self_attn_layer_norm."),
                 (".mlp_ln.", ".final_layer_norm."), (".cross_attn.", ".encoder_attn."), (".attn.", ".self_attn."),
                 (".mlp.0.", ".fc1."), (".mlp.2.", ".fc2."), (".query.", ".q_proj."), (".key.", ".k_proj."),
                 (".value.", ".v_proj."), (".out.", ".out_proj.")):
        n = n.replace(a, b)
    return "model." + n


def read_ggml(path):
    """hparams and [(name, dtype, numpy shape, byte offset)] of a legacy ggml Whisper file."""
    with open(path, "rb") as f:
        buf = f.read(1 << 20)
        size = os.fstat(f.fileno()).st_size
    assert struct.unpack_from("<i", buf, 0)[0] == 0x67676D6C, "not a ggml whisper file"
    hp = struct.unpack_from("<11i", buf, 4)
    off = 4 + 44
    n_mel, n_fft = struct.unpack_from("<ii", buf, off)
    off += 8 + 4 * n_mel * n_fft
    tensors = []
    with open(path, "rb") as f:
        f.seek(off)
        (n_vocab_words,) = struct.unpack("<i", f.read(4))
        for _ in range(n_vocab_words):
            (ln,) = struct.unpack("<i", f.read(4))
            f.seek(ln, 1)
        while f.tell() < size:
            nd, nl, tt = struct.unpack("<iii", f.read(12))
            ne = struct.unpack("<%di" % nd, f.read(4 * nd))
            name = f.read(nl).decode()
            dt = {0: np.float32, 1: np.float16}[tt]
            shape = tuple(reversed(ne))
            tensors.append((name, np.dtype(dt), shape, f.tell()))
            f.seek(int(np.prod(shape)) * np.dtype(dt).itemsize, 1)
    keys = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
            "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")
    return dict(zip(keys, hp)), tensors


def both_exact(w16):
    """f16 -> the nearest value held exactly by f16 and bf16 (bf16 round-to-nearest-even, then f16)."""
    u = w16.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    z = r.astype(np.float16)
    assert not (z.astype(np.float32).view(np.uint32) & 0xFFFF).any()
    return z


def convert(ggml, out_dir, tiktoken_gz, dtype="bf16"):
    hp, tensors = read_ggml(ggml)
    os.makedirs(out_dir, exist_ok=True)
    mm = np.memmap(ggml, mode="r+" if dtype == "bf16" else "r", dtype=np.uint8)
    header, blobs, off, changed, total = {}, [], 0, 0, 0
    for name, dt, shape, at in tensors:
        n = int(np.prod(shape))
        a = np.ndarray(shape, dtype=dt, buffer=mm, offset=at)
        hn = hf_name(name)
        if hn.endswith("conv1.bias") or hn.endswith("conv2.bias"):
            shape = (shape[0],)  # ggml keeps conv biases as [n_state, 1]
        if dt == np.float16 and dtype == "bf16":
            z = both_exact(np.asarray(a))
            changed += int((z.view(np.uint16) != np.asarray(a).view(np.uint16)).sum())
            total += n
            a[...] = z  # the ggml file gets the same numbers
            data, st_dt = (z.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes(), "BF16"
        elif dt == np.float16:
            data, st_dt = np.asarray(a).tobytes(), "F16"
        else:
            data, st_dt = np.asarray(a).tobytes(), "F32"
        header[hn] = {"dtype": st_dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    mm.flush()
    del mm
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    d, L = hp["n_audio_state"], hp["n_audio_layer"]
    cfg = {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "activation_function": "gelu", "d_model": d, "encoder_layers": L, "decoder_layers": hp["n_text_layer"],
        "encoder_attention_heads": hp["n_audio_head"], "decoder_attention_heads": hp["n_text_head"],
        "encoder_ffn_dim": 4 * d, "decoder_ffn_dim": 4 * d, "num_mel_bins": hp["n_mels"],
        "vocab_size": hp["n_vocab"], "max_source_positions": hp["n_audio_ctx"],
        "max_target_positions": hp["n_text_ctx"], "decoder_start_token_id": 50258, "eos_token_id": 50257,
        "scale_embedding": False, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16" if dtype == "bf16" else "float16",
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with gzip.open(tiktoken_gz, "rb") as s, open(os.path.join(out_dir, "multilingual.tiktoken"), "wb") as t:
        shutil.copyfileobj(s, t)
    print("%s -> %s: %d tensors, %s; %d of %d f16 values rounded to f16∩bf16 (written back into the ggml file)"
          % (ggml, out_dir, len(tensors), dtype, changed, total))


# ---------------- audio ----------------

def make_audio(src, dst, secs):
    with wave.open(src) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    n = int(secs * 16000)
    reps = n // len(x)
    y = np.zeros(n, dtype=np.int16)
    y[:reps * len(x)] = np.tile(x, reps)
    with wave.open(dst, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(y.tobytes())


# ---------------- table ----------------

def parse_osprey_bench(path):
    j = json.loads([l for l in open(path) if l.startswith("{")][-1])
    return {"enc": j["encoder_s"], "dec": 1000.0 / j["decode_tok_s"], "prec": j["precision"]}


def parse_harness_bench(path):
    rows = [l.split("\t") for l in open(path) if re.match(r"^\d+\t", l)]
    return {"enc": min(float(r[1]) for r in rows) / 1000, "dec": min(float(r[2]) for r in rows)}


def parse_osprey_transcribe(path):
    """The last file's line: wall of the transcription (its time less the audio file's decoding), tokens."""
    pat = r"of audio in ([\d.]+) s \(decoding the file ([\d.]+) s\).*; (\d+) tokens in (\d+) segments"
    m = re.findall(pat, open(path, errors="replace").read())
    t, dec, ntok, nseg = m[-1]
    return {"wall": float(t) - float(dec), "ntok": int(ntok), "nseg": int(nseg)}


def parse_harness_full(path):
    rows = [l.rstrip("\n").split("\t") for l in open(path) if re.match(r"^[1-9]\d*\t", l)]
    r = rows[-1]
    return {"wall": float(r[1]) / 1000, "ntok": int(r[15]), "nseg": int(r[14]), "fallbacks": int(r[13]),
            "enc": float(r[3]) / 1000 / max(1, int(r[4])), "dec": float(r[5]) / max(1, int(r[6]))}


def med(vals):
    return statistics.median(vals) if vals else None


def table(work, sizes):
    raw = os.path.join(work, "raw")
    parsers = {("osprey", "bench"): parse_osprey_bench, ("whispercpp", "bench"): parse_harness_bench,
               ("osprey", "w11"): parse_osprey_transcribe, ("osprey", "w300"): parse_osprey_transcribe,
               ("whispercpp", "w11"): parse_harness_full, ("whispercpp", "w300"): parse_harness_full}
    rows = []
    notes = []
    for size in sizes:
        got = {}
        for (prog, kind), parse in parsers.items():
            got[prog, kind] = []
            for p in sorted(glob.glob(os.path.join(raw, "%s.%s.%s.r*.txt" % (size, prog, kind)))):
                try:
                    got[prog, kind].append(parse(p))
                except Exception as e:  # a run that failed: say so, keep the others
                    notes.append("%s: unreadable (%s)" % (os.path.basename(p), e))
        over = {}  # (prog, kind, key) -> values that replace those of the runs

        def vals(prog, kind, key):
            return over.get((prog, kind, key), [g[key] for g in got[prog, kind]])

        def fig(prog, kind, key):
            return med(vals(prog, kind, key))
        n_rounds = max(len(v) for v in got.values()) if got else 0
        # whisper.cpp's encoder and decoder: the lower median of its bench mode and its own timers inside
        # whisper_full on real audio (the two agree on a quiet machine; a busy one slows one or the other)
        for key in ("enc", "dec"):
            b = fig("whispercpp", "bench", key)
            tv = [{key: g[key]} for k in ("w11", "w300") for g in got["whispercpp", k]]
            t = med([g[key] for g in tv])
            if b and t:
                notes.append("%s: whisper.cpp %s, bench mode %.4g, its timers in whisper_full %.4g (table: the lower)"
                             % (size, {"enc": "encoder s/window", "dec": "decoder ms/token"}[key], b, t))
                if t < b:
                    over["whispercpp", "bench", key] = [g[key] for g in tv]
        for label, kind, key, unit in (("encoder s/window", "bench", "enc", "s"),
                                       ("decoder ms/token", "bench", "dec", "ms"),
                                       ("11 s sample, wall s", "w11", "wall", "s"),
                                       ("5 min, wall s", "w300", "wall", "s")):
            o, w = fig("osprey", kind, key), fig("whispercpp", kind, key)
            ratio = "%.2fx" % (w / o) if o and w else "-"
            lo = lambda prog: min(vals(prog, kind, key), default=None)
            rows.append((size, label, (o, lo("osprey")), (w, lo("whispercpp")), ratio,
                         "%d/%d" % (len(vals("osprey", kind, key)), len(vals("whispercpp", kind, key)))))
        # The decoder inside a transcription, derived the same way for both: (5 min wall - windows x encoder
        # per window from the bench) / tokens. osprey's bench runs a 768 MiB STREAM triad every 8 decoder steps,
        # which empties this CPU's last-level cache; whisper.cpp's bench does not.
        # the fastest encoder of the rounds: a slowed round would make this negative
        eo = min(vals("osprey", "bench", "enc"), default=None)
        ew = min(vals("whispercpp", "bench", "enc"), default=None)
        derived = {}
        for prog, e in (("osprey", eo), ("whispercpp", ew)):
            g = got[prog, "w300"]
            if g and e:
                nt = g[0]["ntok"] + (g[0]["nseg"] if prog == "whispercpp" else 0)
                derived[prog] = 1000 * (med([x["wall"] for x in g]) - g[0]["nseg"] * e) / nt
        if len(derived) == 2:
            rows.append((size, "5 min, all but the encoder, ms/token (derived)", derived["osprey"],
                         derived["whispercpp"], "%.2fx" % (derived["whispercpp"] / derived["osprey"]), "derived"))
        for kind in ("w11", "w300"):
            # whisper.cpp's segment tokens leave out the closing timestamp that osprey counts: add one a segment
            ot = sorted(set((g["ntok"], g["nseg"]) for g in got["osprey", kind]))
            wt = sorted(set((g["ntok"] + g["nseg"], g["nseg"]) for g in got["whispercpp", kind]))
            fb = sorted(set(g["fallbacks"] for g in got["whispercpp", kind]))
            if ot or wt:
                notes.append("%s %s: (tokens, segments) osprey %s, whisper.cpp %s (its tokens + 1 a segment; "
                             "fallbacks %s)%s" % (size, kind, ot, wt, fb, "" if ot == wt else "  <-- DIFFER"))
        for tag in ("before", "during"):
            busy = []
            for p in glob.glob(os.path.join(raw, "%s.*.r*.txt" % size)):
                busy += [int(l.split()[1]) for l in open(p, errors="replace") if l.startswith("#busy_" + tag)]
            if busy:
                notes.append("%s: the cores' share taken by others' jobs %s a run: median %d%%, max %d%% over %d runs"
                             % (size, tag, med(busy), max(busy), len(busy)))
        prec = sorted(set(g["prec"] for g in got["osprey", "bench"]))
        if prec:
            notes.append("%s: osprey bench precision %s; %d round(s)" % (size, ",".join(prec), n_rounds))
    print("| size | figure | osprey median (best) | whisper.cpp median (best) | osprey/whisper.cpp (medians) | runs (o/w) |")
    print("|---|---|---|---|---|---|")
    for size, label, o, w, ratio, n in rows:
        def f(v):
            if isinstance(v, tuple):
                return "-" if v[0] is None else "%.4g (%.4g)" % v
            return "-" if v is None else "%.4g" % v
        print("| %s | %s | %s | %s | %s | %s |" % (size, label, f(o), f(w), ratio, n))
    print()
    for n in notes:
        print("- " + n)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "convert":
        a = sys.argv[2:]
        dtype = "bf16"
        if "--dtype" in a:
            i = a.index("--dtype")
            dtype = a[i + 1]
            del a[i:i + 2]
        convert(a[0], a[1], a[2], dtype)
    elif cmd == "audio":
        make_audio(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    elif cmd == "table":
        table(sys.argv[2], sys.argv[3:])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
