#!/bin/sh
# The main job: set up, then run osprey. With no arguments it asks the bundled
# default model (models/fortune) for a fortune; any arguments are passed to
# osprey (e.g. `scripts/run.sh chat`).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh >/dev/null
if [ $# -eq 0 ]; then
    # The bundled model (models/fortune) is the default of every command.
    set -- generate --chat --prompt "Tell me a fortune." -n 64
fi
exec ./build/osprey "$@"
