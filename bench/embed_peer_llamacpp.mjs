#!/usr/bin/env node
// llama.cpp's embedding path (node-llama-cpp's createEmbeddingContext + getEmbeddingFor) on a GGUF: the tokens per
// second of embedding N inputs of T tokens, one input after another as that API runs them. Printed as one JSON line.
// Driven by bench/embed_peer.sh, which times osprey on the same shape beside it.
//
// The inputs are token ids as `osprey bench --embed` makes them ((i*7919+13) % vocab over the N*T ids), except
// that an input starts with BOS when the model prepends one and ends with EOS when it appends one, so that every
// input is exactly T tokens (checked with calculateInputLength). One warm-up input first (not timed). The vector's
// width and finiteness are checked.
// Usage: node embed_peer_llamacpp.mjs --model F.gguf [-t 2] [-n 1000] [-p 256] [--nlc /tmp/nlc]
import path from "node:path";
import { performance } from "node:perf_hooks";

const args = process.argv.slice(2);
const opt = (names, def) => {
    for (let i = 0; i < args.length; i++) if (names.includes(args[i]) && i + 1 < args.length) return args[i + 1];
    return def;
};
const modelPath = opt(["--model", "-m"]);
const threads = parseInt(opt(["-t", "--threads"], "2"));
const N = parseInt(opt(["-n", "--inputs"], "1000"));
const T = parseInt(opt(["-p"], "256"));
const nlcDir = opt(["--nlc"], process.env.NLC_DIR || "/tmp/nlc");
if (!modelPath || !(N > 0) || !(T > 1)) {
    console.error("usage: node embed_peer_llamacpp.mjs --model F.gguf [-t 2] [-n INPUTS] [-p TOKENS] [--nlc DIR]");
    process.exit(2);
}
const { getLlama, LlamaLogLevel } = await import(path.join(nlcDir, "node_modules/node-llama-cpp/dist/index.js"));
const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true, progressLogs: false,
    maxThreads: threads, logLevel: LlamaLogLevel.error
});
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const ctx = await model.createEmbeddingContext({ contextSize: T + 16, batchSize: 512, threads });

const vocab = model.tokens.vocabularySize;
const { bos, eos } = model.tokens;
const input = (k) => {
    const ids = Array.from({ length: T }, (_, t) => ((k * T + t) * 7919 + 13) % vocab);
    if (model.tokens.shouldPrependBosToken) ids[0] = bos;
    if (model.tokens.shouldAppendEosToken) ids[T - 1] = eos;
    return ids;
};
const problems = [];
if (ctx.calculateInputLength(input(0)) !== T) problems.push(`an input is ${ctx.calculateInputLength(input(0))} tokens, not ${T}`);
const check = (e) => {
    if (e.vector.length !== model.embeddingVectorSize || !e.vector.every(Number.isFinite)) problems.push("bad vector");
};
check(await ctx.getEmbeddingFor(input(N))); // warm-up: an input not among the timed ones
const t0 = performance.now();
for (let k = 0; k < N; k++) check(await ctx.getEmbeddingFor(input(k)));
const s = (performance.now() - t0) / 1000;
const maps = (await import("node:fs")).readFileSync("/proc/self/maps", "utf8");
const cpu = [...new Set(maps.split("\n").map((l) => path.basename(l.trim().split(/\s+/)[5] ?? "")).filter((p) => /^libggml-cpu/.test(p)))];
console.log(JSON.stringify({
    engine: "llama.cpp", via: "node-llama-cpp createEmbeddingContext", model: modelPath, threads, embed_inputs: N,
    embed_tokens_per_input: T, embed_s: s, embed_tok_s: (N * T) / s, dims: model.embeddingVectorSize,
    cpu_variant: cpu, llama_cpp_release: llama.llamaCppRelease, ok: problems.length === 0, problems
}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
process.exit(problems.length ? 1 : 0);
