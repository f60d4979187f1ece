#!/bin/sh
# Installs osprey's Debian dependencies (when missing) and builds it in build/.
set -eu
cd "$(dirname "$0")/.."
PKGS="build-essential cmake pkg-config libjansson-dev libcmocka-dev libpcre2-dev libutf8proc-dev libssl-dev libsndfile1-dev libsamplerate0-dev libfftw3-dev zlib1g-dev"
# scripts/test.sh adds what only the tests need (clang + libFuzzer for fuzz/)
PKGS="$PKGS ${OSP_TEST_PKGS:-}"
# python3-jsonschema validates structured output in the end-to-end tests (tests/e2e/validate_json.py)
PKGS="$PKGS python3-jsonschema"
missing=""
# node + npm drive the end-to-end tests (the npm `openai` client); a
# machine that already has a node (e.g. from NodeSource) keeps it.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "installing:$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
