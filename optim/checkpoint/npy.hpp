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

/// The dtype `bytes` declares in its header ("<f4", "<i8", ...), read from the
/// header alone (never from the data); throws as read_npy when there is no valid header.
std::string npy_dtype(const std::string& bytes, const std::string& where);

}  // namespace dpgrad
