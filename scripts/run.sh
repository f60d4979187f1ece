#!/bin/sh
# The main job: set up, then run osprey. With no arguments it generates
# greedily from the bundled default model (models/fortune); any arguments are
# passed to osprey (e.g. `scripts/run.sh inspect MODEL`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh >/dev/null
if [ $# -eq 0 ]; then
    # "<bos><start_of_turn>user\nTell me a fortune.<end_of_turn>\n<start_of_turn>model\n" as ids,
    # until the tokenizer lands; the bundled model (models/fortune) is the default.
    set -- generate --ids 2,3,3428,204,791,352,264,860,19,4,204,3,82,339,342,204 -n 24
fi
exec ./build/osprey "$@"
