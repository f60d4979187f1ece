#!/usr/bin/env python3
"""The prefix cache's benchmark (issue 19): a multi-turn chat whose history
grows to --target tokens, served by `osprey serve`, measuring for every turn
the time to first token of the new turn with the cache (warm) and of the
same prompt without it (cold: "cache_prompt": false), interleaved in one run;
then a restart (SIGTERM writes the cache to disk) and the first request with
the longest cached prefix, warm vs cold; then a miss (a prompt sharing
nothing with the cache) and what the cache's lookup and insert cost it.

Prompts are token ids (/v1/completions), the replies' ids come back with
"return_tokens", so each turn's prompt is the previous prompt + its reply +
a new user part, as a chat client resends it. Time to first token is
measured by the client (the first SSE chunk) and by the server
(timings.ttft_ms); ratios are cold / warm.

usage: bench/prefix_cache.py OSPREY MODEL [--tokenizer DIR] [--first 1024]
       [--user 128] [--reply 64] [--target 4096] [--threads N] [--json]
Stdlib only. MODEL without tokenizer.json gets one from --tokenizer (a
folder with tokenizer.json or tokenizer.json.gz; default: the Llama 3 one
in tests/data/tokenizers/llama3, which fits `osprey synth --preset
llama-3.2-1b`)."""
import argparse, gzip, http.client, json, os, random, re, shutil, signal, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))


def model_dir(model, tok, tmp):
    d = os.path.join(tmp, 'model')
    os.makedirs(d)
    for f in os.listdir(model):
        if f.endswith('.safetensors') or f.endswith('.json') or f.endswith('.jinja'):
            os.symlink(os.path.join(os.path.abspath(model), f), os.path.join(d, f))
    if not os.path.exists(os.path.join(d, 'tokenizer.json')):
        if os.path.exists(os.path.join(tok, 'tokenizer.json')):
            shutil.copy(os.path.join(tok, 'tokenizer.json'), d)
        else:
            with gzip.open(os.path.join(tok, 'tokenizer.json.gz')) as s, open(os.path.join(d, 'tokenizer.json'), 'wb') as o:
                shutil.copyfileobj(s, o)
        cfg = os.path.join(tok, 'tokenizer_config.json')
        if os.path.exists(cfg) and not os.path.exists(os.path.join(d, 'tokenizer_config.json')):
            shutil.copy(cfg, d)
    return d


class Server:
    def __init__(self, osprey, mdir, cache, threads):
        args = [osprey, 'serve', mdir, '--port', '0', '-c', '8192', '--parallel', '1', '--prompt-cache-dir', cache,
                '--log-level', 'info']
        if threads:
            args += ['-t', str(threads)]
        self.p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        t0 = time.time()
        while self.port is None:
            line = self.p.stderr.readline()
            if not line:
                sys.exit('server exited:\n' + ''.join(self.log))
            self.log.append(line)
            m = re.search(r'listening on http://[^\s]*:(\d+)', line)
            if m:
                self.port = int(m.group(1))
        while True:
            try:
                if self.get('/health')[0] == 200:
                    break
            except OSError:
                pass
            if time.time() - t0 > 600:
                sys.exit('server not ready')
            time.sleep(0.05)
        self.ready_s = time.time() - t0

    def get(self, path):
        c = http.client.HTTPConnection('127.0.0.1', self.port, timeout=3600)
        c.request('GET', path)
        r = c.getresponse()
        return r.status, r.read()

    def stats(self):
        return json.loads(self.get('/stats')[1])['prompt_cache']

    def complete(self, ids, max_tokens, cache, bias):
        body = {'prompt': ids, 'max_tokens': max_tokens, 'temperature': 0, 'stream': True, 'return_tokens': True,
                'cache_prompt': cache, 'logit_bias': bias, 'stream_options': {'include_usage': True}}
        c = http.client.HTTPConnection('127.0.0.1', self.port, timeout=3600)
        t0 = time.time()
        c.request('POST', '/v1/completions', json.dumps(body), {'Content-Type': 'application/json'})
        r = c.getresponse()
        if r.status != 200:
            self.fail('request failed: %d %s' % (r.status, r.read()[:300]))
        ttft, toks, final, buf = None, [], None, b''
        while True:
            try:
                chunk = r.read1(65536)
            except (OSError, http.client.HTTPException) as e:
                self.fail('the response broke off: %r' % e)
            if not chunk:
                break
            buf += chunk
            while b'\n\n' in buf:
                ev, buf = buf.split(b'\n\n', 1)
                if not ev.startswith(b'data: {'):
                    continue
                if ttft is None:
                    ttft = time.time() - t0
                d = json.loads(ev[6:])
                if d.get('choices'):
                    toks += d['choices'][0].get('tokens', [])
                if d.get('usage'):
                    final = d
        return {'ttft_s': ttft, 'tokens': toks, 'server_ttft_s': final['timings']['ttft_ms'] / 1e3,
                'cached': final['usage']['prompt_tokens_details']['cached_tokens'], 'n_prompt': final['usage']['prompt_tokens']}

    def fail(self, why):
        try:
            self.p.send_signal(signal.SIGTERM)
            _, err = self.p.communicate(timeout=60)
            self.log.append(err)
        except Exception:
            pass
        sys.exit('%s (server exit %s)\n%s' % (why, self.p.returncode, ''.join(self.log)[-4000:]))

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        t0 = time.time()
        _, err = self.p.communicate(timeout=600)
        self.log.append(err)
        if self.p.returncode != 0:
            sys.exit('server exit %d:\n%s' % (self.p.returncode, ''.join(self.log)))
        return time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('osprey')
    ap.add_argument('model')
    ap.add_argument('--tokenizer', default=os.path.join(HERE, '..', 'tests', 'data', 'tokenizers', 'llama3'))
    ap.add_argument('--first', type=int, default=1024)
    ap.add_argument('--user', type=int, default=128)
    ap.add_argument('--reply', type=int, default=64)
    ap.add_argument('--target', type=int, default=4096)
    ap.add_argument('--threads', type=int, default=0)
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args()
    rng = random.Random(19)
    tmp = tempfile.mkdtemp(prefix='osp_pcbench_')
    try:
        mdir = model_dir(a.model, a.tokenizer, tmp)
        cache = os.path.join(tmp, 'cache')
        cfg = json.load(open(os.path.join(mdir, 'config.json')))
        cfg = cfg.get('text_config', cfg)
        vocab = cfg['vocab_size']
        eos = cfg.get('eos_token_id', [])
        eos = eos if isinstance(eos, list) else [eos]
        bias = {str(t): -100 for t in eos if t is not None}  # replies of the full length, as a chat's
        words = lambda n: [rng.randrange(1000, min(vocab, 100000)) for _ in range(n)]
        srv = Server(a.osprey, mdir, cache, a.threads)
        history, turns = words(a.first), []
        prompt = history
        print('%5s %7s %7s | %9s %9s %6s | %9s %9s %6s' % ('turn', 'prompt', 'cached', 'cold ms', 'warm ms', 'x',
                                                         'cold srv', 'warm srv', 'x'), file=sys.stderr)
        k = 0
        while True:
            if k % 2 == 0:
                cold = srv.complete(prompt, 1, False, bias)
                warm = srv.complete(prompt, a.reply, True, bias)
            else:
                warm = srv.complete(prompt, a.reply, True, bias)
                cold = srv.complete(prompt, 1, False, bias)
            t = {'turn': k, 'prompt': len(prompt), 'cached': warm['cached'], 'cold_ttft_s': cold['ttft_s'],
                 'warm_ttft_s': warm['ttft_s'], 'cold_server_ttft_s': cold['server_ttft_s'],
                 'warm_server_ttft_s': warm['server_ttft_s']}
            t['speedup'] = cold['ttft_s'] / warm['ttft_s']
            t['speedup_server'] = cold['server_ttft_s'] / warm['server_ttft_s']
            turns.append(t)
            print('%5d %7d %7d | %9.1f %9.1f %6.1f | %9.1f %9.1f %6.1f' % (
                k, t['prompt'], t['cached'], 1e3 * t['cold_ttft_s'], 1e3 * t['warm_ttft_s'], t['speedup'],
                1e3 * t['cold_server_ttft_s'], 1e3 * t['warm_server_ttft_s'], t['speedup_server']), file=sys.stderr)
            history = prompt + warm['tokens']
            if len(history) + a.user > a.target:
                break
            prompt = history + words(a.user)
            k += 1
        # a miss: nothing in common with the cache (measured against the same prompt cold)
        st0 = srv.stats()
        miss_prompt = words(len(prompt))
        miss = srv.complete(miss_prompt, 1, True, bias)
        st1 = srv.stats()
        miss_cold = srv.complete(miss_prompt, 1, False, bias)
        miss_cost_s = (st1['lookup_seconds'] - st0['lookup_seconds']) + (st1['insert_seconds'] - st0['insert_seconds'])
        stop_s = srv.stop()
        # a restart: the first request with the longest cached prefix (the last turn's prompt and reply)
        srv = Server(a.osprey, mdir, cache, a.threads)
        st = srv.stats()
        again = history + words(a.user)
        warm_r = srv.complete(again, 1, True, bias)
        cold_r = srv.complete(again, 1, False, bias)
        srv.stop()
        later = turns[1:]
        res = {
            'model': a.model, 'turns': turns,
            'min_turn_speedup': min(t['speedup'] for t in later) if later else None,
            'min_turn_speedup_server': min(t['speedup_server'] for t in later) if later else None,
            'restart': {'prompt': len(again), 'cached': warm_r['cached'], 'disk_entries': st['disk_entries'],
                        'cold_ttft_s': cold_r['ttft_s'], 'warm_ttft_s': warm_r['ttft_s'],
                        'speedup': cold_r['ttft_s'] / warm_r['ttft_s'],
                        'speedup_server': cold_r['server_ttft_s'] / warm_r['server_ttft_s'], 'shutdown_s': stop_s},
            'miss': {'prompt': len(miss_prompt), 'cached': miss['cached'], 'lookup_insert_s': miss_cost_s,
                     'cold_prefill_s': miss_cold['server_ttft_s'],
                     'cost_ratio': miss_cost_s / miss_cold['server_ttft_s'],
                     'ttft_ratio': miss['server_ttft_s'] / miss_cold['server_ttft_s']},
        }
        r = res['restart']
        m = res['miss']
        print('turns after the first: time to first token at least %.1fx better warm than cold (server-side %.1fx)'
              % (res['min_turn_speedup'] or 0, res['min_turn_speedup_server'] or 0), file=sys.stderr)
        print('restart (%d entries on disk): %d of %d tokens cached, %.0f ms vs %.0f ms cold: %.1fx (server %.1fx)' % (
            r['disk_entries'], r['cached'], r['prompt'], 1e3 * r['warm_ttft_s'], 1e3 * r['cold_ttft_s'], r['speedup'],
            r['speedup_server']), file=sys.stderr)
        print('miss (%d tokens): lookup + insert %.2f ms = %.3f%% of its cold prefill (%.0f ms); ttft miss/cold %.3f' % (
            m['prompt'], 1e3 * m['lookup_insert_s'], 100 * m['cost_ratio'], 1e3 * m['cold_prefill_s'], m['ttft_ratio']),
            file=sys.stderr)
        if a.json:
            print(json.dumps(res))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    main()
