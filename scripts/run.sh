#!/bin/sh
# The main job: set up, then run osprey. With no arguments it generates
# greedily from the bundled golden Llama 3 checkpoint; any arguments are
# passed to osprey (e.g. `scripts/run.sh inspect MODEL`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh >/dev/null
if [ $# -eq 0 ]; then
    set -- generate --model tests/data/goldens/llama3 --ids 1,5,9,200,7 -n 24
fi
exec ./build/osprey "$@"
