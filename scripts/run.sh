#!/bin/sh
# The main job: set up, then run osprey. With no arguments it serves the
# bundled default model (models/fortune) on http://127.0.0.1:8080 (an
# OpenAI-compatible API; Ctrl-C stops it); any arguments are passed to
# osprey (e.g. `scripts/run.sh chat`, `scripts/run.sh serve MODEL --port 9000`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh >/dev/null
if [ $# -eq 0 ]; then
    # The bundled model (models/fortune) is the default of every command.
    set -- serve
fi
exec ./build/osprey "$@"
