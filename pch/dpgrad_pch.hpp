// Precompiled header: the xtensor headers nearly every translation unit includes
// (about 3 s of compile time each without it).
#include "engine/array.hpp"
