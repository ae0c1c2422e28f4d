#!/usr/bin/env bash
# The folders of the library include each other downwards only (docs/library.md):
#   engine <- data, privacy <- layers <- optim <- onnx, audit and the rest above
# A folder may include itself and those of a lower rank, never one of its own
# rank or above: so no folder includes a folder that includes it back.
#   check_layout.sh SOURCE_ROOT
set -u
root=${1:-.}
rank() {
  case $1 in
    engine) echo 0 ;;
    data | privacy) echo 1 ;;
    layers) echo 2 ;;
    optim) echo 3 ;;
    onnx) echo 4 ;;
    *) echo 9 ;;
  esac
}
bad=0
checked=0
for dir in engine data privacy layers optim onnx; do
  [ -d "$root/$dir" ] || continue
  mine=$(rank "$dir")
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(printf '%s\n' "$line" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
    [ "$target" = "$dir" ] && continue
    theirs=$(rank "$target")
    checked=$((checked + 1))
    if [ "$theirs" -ge "$mine" ]; then
      echo "layout: ${file#"$root"/} ($dir) includes $target/, which is not below it" >&2
      bad=1
    fi
  done < <(grep -rHE '^#include "[a-z_]+/' "$root/$dir" --include='*.hpp' --include='*.cpp' --include='*.in')
done
[ "$checked" -gt 0 ] || { echo "layout: no include between folders was found under $root" >&2; exit 1; }
if [ "$bad" -ne 0 ]; then echo "layout: FAILED"; exit 1; fi
echo "layout: $checked includes between folders, all downwards"
