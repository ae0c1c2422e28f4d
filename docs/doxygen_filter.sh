#!/bin/sh
# Doxygen's input filter (docs/Doxyfile): a field's trailing "// ..." comment,
# after code that ends in ';', ',' or '{', becomes "///< ...", its documentation.
exec sed -E 's#^([^/]*[;,{][[:space:]]*)// #\1///< #' "$1"
