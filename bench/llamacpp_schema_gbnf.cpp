/* MaskBench's schemas through llama.cpp's own JSON-schema-to-GBNF converter (common/json-schema-to-grammar,
 * what llama-server's json_schema field uses), for bench/maskbench_peer.mjs --gbnf: node-llama-cpp's
 * createGrammarForJsonSchema is a converter of its own, with a smaller subset.
 * 
 * Input: MaskBench lines {"id", "schema", "tests"} on stdin. Output: one line a schema,
 * {"id", "gbnf", "convert_us"} or {"id", "error", "convert_us"} (convert_us: thread CPU time of the conversion).
 * Each conversion runs in a child process: the converter crashes on some schemas (a crash is an error line).
 * Build, against the llama.cpp that node-llama-cpp 3.22.1 ships (headers from its git bundle):
 *   git clone -q /tmp/nlc/node_modules/node-llama-cpp/llama/gitRelease.bundle /tmp/llamacpp-src
 *   B=/tmp/nlc/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 S=/tmp/llamacpp-src
 *   g++ -std=c++17 -O2 -Wall -I$S/common -I$S/vendor -I$S/include -I$S/ggml/include bench/llamacpp_schema_gbnf.cpp \
 *       -o /tmp/llamacpp_schema_gbnf $B/libllama-common.so $B/libllama.v0.5.0.so $B/libggml.v0.5.0.so \
 *       $B/libggml-base.so -Wl,-rpath,$B
 * Run: xz -dc maskbench-dev.jsonl.xz | /tmp/llamacpp_schema_gbnf > /tmp/mb.gbnf.jsonl
 */
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <iostream>
#include <string>
#include "json-schema-to-grammar.h"
#include "nlohmann/json.hpp"

static double now_us() {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

int main() {
    std::string line;
    long n = 0, bad = 0;
    while (std::getline(std::cin, line)) {
        if (line.empty()) continue;
        nlohmann::ordered_json out;
        try {
            auto j = nlohmann::ordered_json::parse(line);
            out["id"] = j.value("id", "");
            const std::string schema = j.at("schema").dump();
            int fd[2];
            if (pipe(fd) != 0) { std::cerr << "llamacpp_schema_gbnf: pipe failed\n"; return 1; }
            pid_t pid = fork();
            if (pid == 0) {  // the child converts and writes {"gbnf"|"error", "convert_us"}
                close(fd[0]);
                nlohmann::ordered_json r;
                double t0 = now_us();
                try {
                    r["gbnf"] = json_schema_to_grammar(common_json::parse(schema));
                } catch (const std::exception & e) {
                    r["error"] = std::string(e.what());
                }
                r["convert_us"] = now_us() - t0;
                const std::string b = r.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
                for (size_t o = 0; o < b.size();) {
                    ssize_t w = write(fd[1], b.data() + o, b.size() - o);
                    if (w <= 0) _exit(1);
                    o += (size_t)w;
                }
                _exit(0);
            }
            close(fd[1]);
            std::string got;
            char buf[65536];
            ssize_t rd;
            while ((rd = read(fd[0], buf, sizeof buf)) > 0) got.append(buf, (size_t)rd);
            close(fd[0]);
            int status = 0;
            waitpid(pid, &status, 0);
            if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                auto r = nlohmann::ordered_json::parse(got);
                for (auto it = r.begin(); it != r.end(); ++it) out[it.key()] = it.value();
                if (r.contains("error")) bad++;
            } else {
                out["error"] = WIFSIGNALED(status) ? "the converter crashed (signal " + std::to_string(WTERMSIG(status)) + ")"
                                                   : std::string("the converter's process failed");
                bad++;
            }
        } catch (const std::exception & e) {
            std::cerr << "llamacpp_schema_gbnf: line " << n + 1 << " is not a MaskBench line: " << e.what() << "\n";
            return 1;
        }
        std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
        n++;
    }
    std::cerr << "llamacpp_schema_gbnf: " << n << " schemas, " << bad << " not converted\n";
    return 0;
}
