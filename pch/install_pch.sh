#!/usr/bin/env bash
# Run by `meson install` (meson.build): precompiles the installed umbrella header for
# the README's command, `c++ -std=c++20 -O2 prog.cpp $(pkg-config --cflags --libs dpgrad)`.
# GCC looks for <dpgrad/dpgrad.hpp> as include/dpgrad/dpgrad.hpp.gch/ first and uses the
# file in it that was built with the same compiler and flags; with other flags it reads
# the headers as text, as before. docs/library.md, "Compile time".
#
# Arguments: the include and library folders (relative to the prefix, or absolute),
# then the compiler's command. A failure leaves the install as it would be without
# this step and says so; it does not fail the install.
set -uo pipefail

includedir=$1 libdir=$2
shift 2
compiler=("$@")
prefix=${MESON_INSTALL_DESTDIR_PREFIX:?run by meson install}

installed() {  # a folder given to meson, as installed (DESTDIR included)
  case $1 in
    /*) echo "${DESTDIR:-}$1" ;;
    *) echo "$prefix/$1" ;;
  esac
}

warn() {
  echo "dpgrad: the precompiled header was not installed: $*;" \
    "programs still compile, reading the headers as text (docs/library.md, \"Compile time\")" >&2
  exit 0
}

header=$(installed "$includedir")/dpgrad/dpgrad.hpp
folder=$header.gch
pkgconfig=$(installed "$libdir")/pkgconfig
[ -f "$header" ] || warn "$header is missing"
[ -f "$pkgconfig/dpgrad.pc" ] || warn "$pkgconfig/dpgrad.pc is missing"
# the flags a user's program gets: the same include folders and macros, or GCC refuses the file
cflags=$(PKG_CONFIG_PATH="$pkgconfig" pkg-config --cflags dpgrad) || warn "pkg-config could not read dpgrad.pc"
read -r -a cflags <<<"$cflags"

if [ -e "$folder" ] || [ -L "$folder" ]; then
  [ -d "$folder" ] && [ ! -L "$folder" ] || warn "$folder exists and is not a folder"
fi
mkdir -p "$folder" || warn "cannot create $folder"
# precompiled headers of an earlier install hold its headers, and GCC does not check that they
# still match: every one goes (the one of these flags is rebuilt below; others are the user's to rebuild)
removed=0
for old in "$folder"/*.gch; do
  [ -f "$old" ] && [ ! -L "$old" ] || continue
  [ "$old" = "$folder/c++20-O2.gch" ] || removed=$((removed + 1))
  rm -f "$old"
done
target=$folder/c++20-O2.gch
[ ! -e "$target" ] || { [ -f "$target" ] && [ ! -L "$target" ]; } || warn "$target exists and is not a regular file"
partial=$(mktemp "$folder/.partial.XXXXXX") || warn "cannot write in $folder"
# -w: the header compiled on its own warns that #pragma once is in the main file
if ! "${compiler[@]}" -std=c++20 -O2 "${cflags[@]}" -w -x c++-header "$header" -o "$partial"; then
  rm -f "$partial"
  warn "the compiler failed on $header"
fi
[ -s "$partial" ] || { rm -f "$partial"; warn "the compiler wrote nothing"; }
chmod 644 "$partial" && mv -f "$partial" "$target" || { rm -f "$partial"; warn "cannot move it to $target"; }
echo "dpgrad: precompiled <dpgrad/dpgrad.hpp> for c++ -std=c++20 -O2: $target ($(du -m "$target" | cut -f1) MB)"
if ((removed)); then
  echo "dpgrad: removed $removed precompiled header(s) of the previous install, built for other flags: rebuild them" \
    "(docs/library.md, \"Compile time\")"
fi
