#!/usr/bin/env bash
# Every public declaration of the installed headers has a comment (docs/api.md):
# each class, struct, enum, function, alias, constant and public data member at
# namespace or class scope. A comment counts when it ends on the line above the
# declaration (template lines in between are fine), or trails the declaration's
# first line; it also covers the declarations that follow it without a blank
# line (a group of overloads, a block of fields). Not checked: private sections,
# function bodies, enum values, forward declarations, overrides (their base
# says what they do), destructors, defaulted or deleted members, friends, and
# lines inside `namespace detail`.
#   check_comments.sh HEADER...
set -u
(($#)) || { echo "usage: check_comments.sh HEADER..." >&2; exit 2; }
awk '
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
function report(what) {
  printf "%s:%d: no comment: %s\n", FILENAME, FNR, substr(what, 1, 100)
  missing++
}
FNR == 1 {
  files++; depth = 0; cont = 0; covered = 0; in_comment = 0; last_comment = 0
  delete kind; delete private_
}
{
  line = $0
  s = trim(line)
  code = s
  sub(/[ \t]*\/\/.*$/, "", code)          # the code before a trailing comment
  trailing = (index(s, "//") > 1)
  # block comments
  if (in_comment) { if (s ~ /\*\//) { in_comment = 0; last_comment = FNR; covered = 1 } ; next }
  if (s ~ /^\/\*/) { if (s !~ /\*\//) in_comment = 1; else { last_comment = FNR; covered = 1 }; next }
  if (s == "") { covered = 0; next }
  if (s ~ /^\/\//) { last_comment = FNR; covered = 1; next }
  if (s ~ /^#/) { covered = 0; next }
  top = depth > 0 ? kind[depth] : "ns"
  checkable = (top == "ns" || top == "class") && !(depth > 0 && private_[depth]) && !cont
  if (top == "class" && code ~ /^(public|private|protected):/) {
    private_[depth] = (code !~ /^public:/)
    covered = 0
    next
  }
  if (checkable) {
    skip = 0
    if (code ~ /^template[ \t]*</ && code ~ />$/) skip = 1                     # the line above a template
    else if (code ~ /^[}{]/) skip = 1
    else if (code ~ /^(namespace|using namespace|friend|static_assert|extern "C")/) skip = 1
    else if (code ~ /^(class|struct|union|enum( class)?)[ \t]+[A-Za-z_][A-Za-z_0-9]*;$/) skip = 1   # forward declaration
    else if (code ~ /^template[ \t]*<.*>[ \t]*(class|struct)[ \t]+[A-Za-z_][A-Za-z_0-9]*;$/) skip = 1
    else if (code ~ /(override|= *default|= *delete)[ \t;{]/ || code ~ /(override|= *default|= *delete);?$/) skip = 1
    else if (code ~ /^(virtual[ \t]+)?~/ || code ~ /^(explicit[ \t]+)?[A-Za-z_][A-Za-z_0-9]*\([^)]*(const [A-Za-z_]+&|&&) *[a-z_]*\) *(noexcept)?/ && code ~ /&/ && code ~ /^[A-Z]/ && code !~ /,/) skip = 1  # destructor, copy or move constructor
    else if (code ~ /^using [A-Za-z_:]+::[A-Za-z_]+;$/) skip = 1         # inherited names
    if (!skip && !covered && !trailing) report(s)
    if (!skip) covered = 1
  }
  # what this line opens and closes: namespaces, classes, enums, bodies
  opens = gsub(/\{/, "{", code); closes = gsub(/\}/, "}", code)
  if (opens > closes) {
    k = "body"
    if (code ~ /^namespace detail/ || code ~ /^namespace [a-z_:]*detail/) k = "detail"
    else if (code ~ /(^|[ \t])namespace([ \t]|$)/ || code ~ /^extern "C"/) k = "ns"
    else if (code ~ /(^|[ \t])enum[ \t]/) k = "enum"
    else if (code ~ /(^|[ \t>])(class|struct|union)[ \t]+[A-Za-z_]/ && code !~ /\(/) k = "class"
    for (i = 0; i < opens - closes; i++) { depth++; kind[depth] = k; private_[depth] = (k == "class" && code ~ /(^|[ \t])class[ \t]/) }
    covered = (k == "class" || k == "ns") ? 0 : covered
  } else if (closes > opens) {
    for (i = 0; i < closes - opens; i++) if (depth > 0) depth--
  }
  # a declaration that goes on over the next lines: they are its own
  cont = (code !~ /[;{}]$/ && code !~ /^template[ \t]*<.*>$/ && code !~ /:$/ && opens == closes && !(code ~ /^[}{]/)) ? 1 : 0
  if (code ~ /,$/ && top == "enum") cont = 0
}
END {
  if (missing) printf "%d public declarations without a comment in %d headers\n", missing, files
  else printf "every public declaration of %d headers has a comment\n", files
  exit missing ? 1 : 0
}' "$@"
