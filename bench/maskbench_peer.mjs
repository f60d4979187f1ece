// MaskBench's runner for llama.cpp's grammar engine, through node-llama-cpp 3.22.1's JSON-schema grammar:
// the peer row beside `osprey maskbench` (src/cli/cmd_maskbench.c), counted the same way.
//
// Setup (once): mkdir -p /tmp/nlc && cd /tmp/nlc && npm init -y && npm install node-llama-cpp@3.22.1 --ignore-scripts
//               /usr/bin/python3 bench/llama3_vocab_gguf.py --out /tmp/llama3-vocab.gguf
// Run:  nice -n 5 node bench/maskbench_peer.mjs --gguf /tmp/llama3-vocab.gguf FILE.jsonl[.xz] \
//           [--shard K/N] [--limit N] [--cap-s 20] [--full-every N] [--nlc /tmp/nlc] [--vocab N] \
//           [--dump FILE] [--gbnf FILE] > out.jsonl
// (--vocab: the vocabulary size, when the GGUF metadata node-llama-cpp reads does not give it; --dump FILE:
// also write each compiled schema's GBNF and its tests' token ids for bench/maskbench_llamacpp_mask.c, which
// times llama.cpp's whole-vocabulary mask directly: "H eos ntrigger ids..." once, then per schema
// "G nbytes id" + the GBNF bytes + "\n", per test "T valid ntokens ids...", and "E" at the schema's end;
// --gbnf FILE: take each schema's grammar from bench/llamacpp_schema_gbnf.cpp's output for the same file (llama.cpp's
// own converter, as llama-server's json_schema) through llama.createGrammar instead: compile is then its
// convert_us + the GBNF parse + the evaluation state, and the end needs only EOS, as such a grammar has no trigger)
//
// Per schema: compile = llama.createGrammarForJsonSchema(schema) (node-llama-cpp's schema-to-GBNF converter,
// then llama.cpp parses the GBNF) + a LlamaGrammarEvaluationState (llama_sampler_init_grammar); a throw is a
// compile error. Per test: tokenize `text` with the GGUF's tokenizer (no special tokens), then per token one
// figure: llama.cpp's one-token check (llama_sampler_apply on a one-candidate array) and, if allowed, the
// commit (llama_sampler_accept). At the end the grammar accepts when node-llama-cpp's end can follow: its JSON
// grammars end in its stop trigger "\n\n\n\n" (generation stops there and the newlines are trimmed), so the
// trigger's tokens must pass check + commit (untimed), and then the EOS token can be next (llama.cpp allows
// end-of-generation tokens only where a grammar stack is empty). Pass / valid rejected / invalid
// accepted as osprey's runner counts them. A schema over --cap-s seconds stops and counts as failing (a timeout,
// reported apart). node-llama-cpp exposes no whole-vocabulary mask, so every --full-every-th token position the
// runner also checks all vocabulary tokens one by one at that state (an upper bound of llama.cpp's mask: each
// call walks the grammar's stacks again, besides its N-API call) and, as the floor of the call overhead, as many
// checks of the EOS token. llama.cpp's real mask (one apply over the whole vocabulary) is what
// bench/maskbench_llamacpp_mask.c times, from --dump.
// Times are wall clock (process.hrtime), one thread. One JSON line a schema on stdout, a summary on stderr.
import { spawnSync } from "node:child_process";
import { openSync, readFileSync, writeSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
const opt = { gguf: null, file: null, skip: 0, every: 1, limit: -1, capS: 20, fullEvery: 0, nlc: "/tmp/nlc", vocab: 0, dump: null, gbnf: null };
for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === "--gguf") opt.gguf = args[++i];
    else if (a === "--shard") [opt.skip, opt.every] = args[++i].split("/").map(Number);
    else if (a === "--limit") opt.limit = Number(args[++i]);
    else if (a === "--cap-s") opt.capS = Number(args[++i]);
    else if (a === "--full-every") opt.fullEvery = Number(args[++i]);
    else if (a === "--nlc") opt.nlc = args[++i];
    else if (a === "--vocab") opt.vocab = Number(args[++i]);
    else if (a === "--dump") opt.dump = args[++i];
    else if (a === "--gbnf") opt.gbnf = args[++i];
    else if (!a.startsWith("-") && !opt.file) opt.file = a;
    else opt.file = null, opt.gguf = null, i = args.length;
}
if (!opt.gguf || !opt.file || !(opt.every >= 1)) {
    console.error("usage: node bench/maskbench_peer.mjs --gguf VOCAB.gguf FILE.jsonl[.xz] [--shard K/N] [--limit N] " +
        "[--cap-s S] [--full-every N] [--nlc DIR] [--vocab N] [--dump FILE] [--gbnf FILE]");
    process.exit(2);
}
const dist = path.join(opt.nlc, "node_modules/node-llama-cpp/dist");
const nlc = await import(pathToFileURL(path.join(dist, "index.js")).href);
const { LlamaSampler } = await import(pathToFileURL(path.join(dist, "evaluator/LlamaContext/LlamaSampler.js")).href);
const { getLlama, LlamaGrammarEvaluationState, LlamaLogLevel } = nlc;

const llama = await getLlama({ gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: opt.gguf, vocabOnly: true, gpuLayers: 0 });
const eos = model.tokens.eos;
const TRIGGER = "\n\n\n\n"; // LlamaJsonSchemaGrammar's stopGenerationTriggers
const triggerIds = opt.gbnf ? [] : model.tokenize(TRIGGER, false);
const accepting = (st) => {
    for (const t of triggerIds) {
        if (!canBe(st, t)) return false;
        try { accept(st, t); } catch { return false; }
    }
    return canBe(st, eos);
};
const V = opt.vocab || model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length;
const canBe = (st, t) => LlamaSampler._canBeNextTokenForGrammarEvaluationState(llama, st, t);
const accept = (st, t) => LlamaSampler._acceptTokenOnGrammarEvaluationState(llama, st, t);
const nowUs = () => Number(process.hrtime.bigint()) / 1e3;
console.error(`maskbench_peer: node-llama-cpp ${nlc.getModuleVersion ? await nlc.getModuleVersion() : "?"}, ` +
    `build ${llama.buildType} ${JSON.stringify(llama.gpu)}, vocab ${V} tokens, eos ${eos}`);
if (!(V > 0) || eos == null) {
    console.error("maskbench_peer: the GGUF has no vocabulary size or EOS token");
    process.exit(1);
}

const dumpFd = opt.dump ? openSync(opt.dump, "w") : null;
const dump = (str) => { if (dumpFd !== null) writeSync(dumpFd, str); };
dump(`H ${eos} ${triggerIds.length} ${triggerIds.join(" ")}\n`);

let text;
if (opt.file.endsWith(".xz")) {
    const r = spawnSync("xz", ["-dc", opt.file], { maxBuffer: 1 << 30, encoding: "utf8" });
    if (r.status !== 0) { console.error(`maskbench_peer: xz -dc ${opt.file} failed: ${r.stderr}`); process.exit(1); }
    text = r.stdout;
} else text = readFileSync(opt.file, "utf8");
const lines = text.split("\n").filter((l) => l.length > 0);
const gbnfs = opt.gbnf ? readFileSync(opt.gbnf, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l)) : null;
if (gbnfs && gbnfs.length !== lines.length) {
    console.error(`maskbench_peer: ${opt.gbnf} has ${gbnfs.length} lines, ${opt.file} ${lines.length}`);
    process.exit(1);
}

const pct = (v, p) => (v.length ? v[Math.min(v.length - 1, Math.round(p * (v.length - 1)))] : 0);
const all = [], compiles = [], fulls = [], floors = [];
let nSchemas = 0, nPass = 0, nCerr = 0, nTimeout = 0, nValidRej = 0, nInvAcc = 0, nInvAccSchemas = 0;

for (let lineno = 0; lineno < lines.length; lineno++) {
    if (lineno % opt.every !== opt.skip) continue;
    if (opt.limit >= 0 && nSchemas >= opt.limit) break;
    nSchemas++;
    let j;
    try { j = JSON.parse(lines[lineno]); } catch (e) {
        console.log(JSON.stringify({ id: "?", compile_error: String(e.message) }));
        nCerr++;
        continue;
    }
    const tests = Array.isArray(j.tests) ? j.tests : [];
    const nValid = tests.filter((t) => t.valid === true).length;
    const o = { id: j.id ?? "" };
    const g = gbnfs?.[lineno];
    if (g && g.id !== o.id) {
        console.error(`maskbench_peer: line ${lineno + 1}: ${opt.gbnf} has ${g.id}, ${opt.file} ${o.id}`);
        process.exit(1);
    }
    const t0 = nowUs();
    let grammar = null, cerr = g?.error ?? null;
    try {
        if (!g) grammar = await llama.createGrammarForJsonSchema(j.schema);
        else if (!cerr) grammar = await llama.createGrammar({ grammar: g.gbnf });
        if (grammar) new LlamaGrammarEvaluationState({ model, grammar });
    } catch (e) { cerr = String(e?.message ?? e); }
    const compileUs = nowUs() - t0 + (g?.convert_us ?? 0);
    o.compile_us = compileUs;
    const mine = [];
    let verr = null, invAcc = false, timedOut = false, sampleUs = 0;
    if (cerr) {
        o.compile_error = cerr;
        nCerr++;
    } else {
        compiles.push(compileUs);
        const gb = Buffer.from(grammar.grammar, "utf8");
        dump(`G ${gb.length} ${o.id}\n`), dump(gb), dump("\n");
        for (const tj of tests) {
            if (typeof tj.text !== "string") continue;
            if (nowUs() - t0 - sampleUs > opt.capS * 1e6) { timedOut = true; break; }
            const ids = model.tokenize(tj.text, false);
            dump(`T ${tj.valid === true ? 1 : 0} ${ids.length} ${ids.join(" ")}\n`);
            const st = new LlamaGrammarEvaluationState({ model, grammar });
            let ok = true;
            for (let k = 0; k < ids.length; k++) {
                if (opt.fullEvery > 0 && (all.length + mine.length) % opt.fullEvery === 0) {
                    const s0 = nowUs();
                    let n = 0;
                    for (let t = 0; t < V; t++) n += canBe(st, t) ? 1 : 0;
                    const s1 = nowUs();
                    for (let t = 0; t < V; t++) canBe(st, eos);
                    const s2 = nowUs();
                    fulls.push(s1 - s0), floors.push(s2 - s1);
                    sampleUs += s2 - s0;
                    if (!o.full_masks) o.full_masks = [];
                    o.full_masks.push({ pos: k, allowed: n, us: Math.round(s1 - s0), eos_floor_us: Math.round(s2 - s1) });
                }
                const a = nowUs();
                let allowed = canBe(st, ids[k]);
                if (allowed) {
                    try { accept(st, ids[k]); } catch { allowed = false; }
                }
                const us = nowUs() - a;
                mine.push(us);
                if (!allowed) { ok = false; break; }
                if (nowUs() - t0 - sampleUs > opt.capS * 1e6) { ok = false; timedOut = true; break; }
            }
            if (timedOut) break;
            if (ok && !accepting(st)) ok = false;
            if (tj.valid === true && !ok && !verr) verr = "should accept but didn't", nValidRej++;
            if (tj.valid !== true && ok) {
                if (!verr) verr = "should reject but didn't";
                invAcc = true, nInvAcc++;
            }
        }
        dump("E\n");
        if (timedOut) nTimeout++;
        else if (!verr) nPass++;
        if (invAcc) nInvAccSchemas++;
    }
    o.masks_us = mine.reduce((s, x) => s + x, 0);
    o.max_mask_us = mine.length ? Math.max(...mine) : 0;
    o.num_tokens = mine.length;
    o.num_tests = tests.length;
    o.num_valid_tests = nValid;
    o.num_invalid_tests = tests.length - nValid;
    o.all_mask_us = mine.map((x) => Math.floor(x * 10) / 10);
    if (timedOut) o.timeout = true;
    if (verr) o.validation_error = verr;
    if (invAcc) o.invalid_accepted = true;
    console.log(JSON.stringify(o));
    for (const x of mine) all.push(x);
}

const num = (x) => Number(x.toFixed(1));
all.sort((a, b) => a - b), compiles.sort((a, b) => a - b), fulls.sort((a, b) => a - b), floors.sort((a, b) => a - b);
console.error(`maskbench_peer: ${nSchemas} schemas, passing ${nPass} (${num(100 * nPass / Math.max(1, nSchemas))}%), ` +
    `compile errors ${nCerr}, timeouts ${nTimeout} (over ${opt.capS} s), valid rejected ${nValidRej} tests, ` +
    `invalid accepted ${nInvAcc} tests in ${nInvAccSchemas} schemas`);
console.error(`maskbench_peer: ${all.length} one-token check + commit: p50 ${num(pct(all, 0.5))} us, ` +
    `p99 ${num(pct(all, 0.99))} us, p99.9 ${num(pct(all, 0.999))} us, max ${num(all.at(-1) ?? 0)} us; ` +
    `compile p50 ${num(pct(compiles, 0.5))} us, p99 ${num(pct(compiles, 0.99))} us`);
if (fulls.length)
    console.error(`maskbench_peer: ${fulls.length} full-vocabulary masks (${V} one-token checks each): ` +
        `p50 ${num(pct(fulls, 0.5))} us, p99 ${num(pct(fulls, 0.99))} us, max ${num(fulls.at(-1))} us; ` +
        `as many EOS checks (call overhead floor): p50 ${num(pct(floors, 0.5))} us`);
