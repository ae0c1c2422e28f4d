// placeholder
#include <doctest/doctest.h>
