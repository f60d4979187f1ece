#!/bin/sh
# The coding agents the e2e suite drives against osprey (tests/e2e/agents.test.mjs), installed from npm at pinned
# versions into a cache outside the clone: $OSP_AGENTS_DIR, default ${XDG_CACHE_HOME:-$HOME/.cache}/osprey-agents,
# one folder per package@version. A fresh machine downloads them once (about 760 MB with their native binaries);
# later runs find the folder and do nothing. An install is built in a temporary folder and renamed into place only
# when whole, so an interrupted one is never taken for done. A failed install fails this script (and the test run):
# the agent tests need them and never skip.
set -eu
cd "$(dirname "$0")/.."
dir=${OSP_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/osprey-agents}
mkdir -p "$dir"
# the versions the tests pin (tests/e2e/agents.json): "package@version bin" a line
node -e 'for (const a of Object.values(require("./tests/e2e/agents.json"))) console.log(a.package + "@" + a.version, a.bin)' |
while read -r spec bin; do
  # @scope/name@version -> one folder name without the slash
  dest="$dir/$(printf %s "$spec" | tr / +)"
  [ -f "$dest/.complete" ] && continue
  tmp=$(mktemp -d "$dir/.install.XXXXXX")
  trap 'rm -rf "$tmp" "$tmp.log"' EXIT INT TERM # an interrupted install leaves nothing
  chmod 755 "$tmp"
  echo "install-agents: $spec -> $dest"
  if ! npm install --prefix "$tmp" --no-audit --no-fund --no-save --loglevel=error "$spec" >"$tmp.log" 2>&1; then
    cat "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    echo "install-agents: npm install $spec failed (the agent tests need it)" >&2
    exit 1
  fi
  rm -f "$tmp.log"
  # the native binary the package fetched for this platform runs
  if ! "$tmp/$bin" --version >/dev/null 2>&1; then
    rm -rf "$tmp"
    echo "install-agents: $spec installed, but '$bin --version' fails" >&2
    exit 1
  fi
  touch "$tmp/.complete"
  [ -f "$dest/.complete" ] || rm -rf "$dest" # a leftover, unless another run finished meanwhile
  # -T: never into a folder another run put there meanwhile; theirs is as good
  if ! mv -T "$tmp" "$dest" 2>/dev/null; then
    rm -rf "$tmp"
    [ -f "$dest/.complete" ] || { echo "install-agents: cannot create $dest" >&2; exit 1; }
  fi
done
