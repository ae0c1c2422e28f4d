// Reading an npy array (numpy's format, as checkpoints store parameters and
// buffers) without trusting anything in it: the magic, the version, the header
// length, the dtype (little-endian float32, float64 or int64), C order, and the shape,
// whose element count times the item size must equal the bytes after the header
// exactly. Nothing is allocated before that holds.
#pragma once

#include <string>

#include "engine/array.hpp"

namespace dpgrad {

/// The array in `bytes`; throws std::invalid_argument starting with `where`.
template <class T>
ArrayT<T> read_npy(const std::string& bytes, const std::string& where);

}  // namespace dpgrad
