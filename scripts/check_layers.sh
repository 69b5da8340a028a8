#!/usr/bin/env bash
# The layers of docs/design.md, checked: a file in a layer's folder includes only its own layer's
# headers and those of the layers listed above it in the table; the public headers include only
# public headers; the command line (tools/sinter/) only public headers and its own. Run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t layers < <(sed -n 's/^| `src\/\([a-z_]*\)\/` |.*/\1/p' docs/design.md)
[ "${#layers[@]}" -gt 5 ] || { echo "check_layers: no layer table found in docs/design.md" >&2; exit 1; }
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done

bad=0
for dir in src/*/; do
  layer=$(basename "$dir")
  if [ -z "${rank[$layer]+x}" ]; then echo "check_layers: src/$layer/ is not in the layer table of docs/design.md"; bad=1; continue; fi
  while IFS=: read -r file line inc; do
    dep=${inc%%/*}
    [ -n "${rank[$dep]+x}" ] || continue
    if [ "${rank[$dep]}" -gt "${rank[$layer]}" ]; then
      echo "$file:$line: src/$layer/ includes $inc, a layer below it in docs/design.md"
      bad=1
    fi
  done < <(grep -rnoE '^#include "[a-z_]+/[^"]+"' "$dir" | sed -E 's/#include "([^"]+)"/\1/')
done
if grep -rnE '^#include "' include/sinter | grep -vE '#include "sinter/'; then
  echo "check_layers: a public header includes a private one"; bad=1
fi
if grep -rnE '^#include "[a-z_]+/' tools/sinter; then
  echo "check_layers: the command line includes a private header (it uses only public ones)"; bad=1
fi
[ "$bad" = 0 ] && echo "check_layers: every include follows the layers of docs/design.md (${#layers[@]} layers)"
exit "$bad"
