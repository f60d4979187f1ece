#!/usr/bin/env python3
"""osprey serve on a GPU, end to end over HTTP with the Python standard
library only (for machines without node and the npm `openai` client, such
as the lent GPU machine): models, a chat completion, a stream, batch
invariance (a request alone and among 16 concurrent ones gives the same
greedy text), a client that disconnects mid-stream, and the server still
answering afterwards.

usage: gpu_serve_check.py OSPREY_BIN MODEL_DIR [--device cuda]"""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

def main():
    binary, model = sys.argv[1], sys.argv[2]
    device = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--device" else "cuda"
    srv = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", "--device", device, "-np", "16"],
                           stderr=subprocess.PIPE, text=True)
    port = None
    log = []
    t0 = time.time()
    while port is None and time.time() - t0 < 60:
        line = srv.stderr.readline()
        if not line:
            break
        log.append(line)
        if "listening on" in line:
            port = int(line.rsplit(":", 1)[1])
    if port is None:
        print("FAIL: the server did not start:", "".join(log))
        return 1
    threading.Thread(target=lambda: [log.append(l) for l in srv.stderr], daemon=True).start()
    base = "http://127.0.0.1:%d" % port
    fails = 0

    def req(path, body=None, timeout=120):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return json.loads(f.read())

    def check(name, ok, detail=""):
        nonlocal fails
        print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + str(detail)))
        fails += 0 if ok else 1

    for _ in range(120):  # the model loads after the socket is bound
        try:
            urllib.request.urlopen(base + "/health", timeout=5)
            break
        except Exception:
            time.sleep(0.5)
    check("device in the log", any(device in l for l in log if "loaded" in l), [l for l in log if "loaded" in l])
    models = req("/v1/models")
    check("GET /v1/models", models.get("data"), models)

    def chat(text, n=24):
        r = req("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": n,
                                         "temperature": 0})
        return r["choices"][0]["message"]["content"]

    alone = chat("Tell me a fortune about rivers.")
    check("chat completion", isinstance(alone, str) and len(alone) > 0, alone)

    # a stream: chunks then [DONE]
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a fortune about rivers."}],
                       "max_tokens": 24, "temperature": 0, "stream": True}).encode()
    r = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    text, done = "", False
    with urllib.request.urlopen(r, timeout=120) as f:
        for raw in f:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                d = json.loads(line[6:])
                if d.get("choices"):
                    text += d["choices"][0].get("delta", {}).get("content") or ""
    check("stream ends with [DONE]", done)
    check("stream text = the completion's", text == alone, (text, alone))

    # batch invariance: the same request among 15 others, all at once
    prompts = ["Tell me a fortune about rivers."] + ["Fortune number %d, please." % i for i in range(15)]
    out = [None] * len(prompts)

    def worker(i):
        try:
            out[i] = chat(prompts[i])
        except Exception as e:
            out[i] = e

    th = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check("16 concurrent requests answered", all(isinstance(o, str) for o in out), out)
    check("batch invariance: alone = in a batch of 16", out[0] == alone, (out[0], alone))

    # a client that goes away mid-stream; the server goes on
    s = socket.create_connection(("127.0.0.1", port))
    b = json.dumps({"messages": [{"role": "user", "content": "A long fortune."}], "max_tokens": 400,
                    "stream": True}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(b) + b)
    s.recv(200)
    s.close()
    time.sleep(0.5)
    again = chat("Tell me a fortune about rivers.")
    check("after a disconnect: same answer", again == alone, (again, alone))
    srv.terminate()
    try:
        rc = srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        rc = -9
    check("clean exit on SIGTERM", rc == 0, rc)
    print("gpu_serve_check: %d failed" % fails)
    return 1 if fails else 0

if __name__ == "__main__":
    sys.exit(main())
