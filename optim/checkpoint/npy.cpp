// The npy reading checkpoints need (optim/checkpoint/npy.hpp).
#include "optim/checkpoint/npy.hpp"

#include <cctype>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dpgrad {

/// The value of `key` in an npy header's dict, up to the next top-level ',' or
/// '}' ("" when absent): the header is Python literal syntax written by numpy or
/// xtensor, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
namespace {

std::string npy_field(const std::string& header, const std::string& key) {
  const std::string quoted = "'" + key + "'";
  const std::size_t k = header.find(quoted);
  if (k == std::string::npos) return "";
  std::size_t i = header.find(':', k + quoted.size());
  if (i == std::string::npos) return "";
  ++i;
  while (i < header.size() && header[i] == ' ') ++i;
  int depth = 0;
  std::size_t j = i;
  for (; j < header.size(); ++j) {
    const char c = header[j];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) return "";
  }
  std::string v = header.substr(i, j - i);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

[[noreturn]] void bad_npy(const std::string& where, const std::string& why) {
  throw std::invalid_argument(where + ": not a valid npy array (" + why + ")");
}

/// The header's text and the offset of the data after it: the magic, the
/// version and the header's length checked.
std::string npy_header(const std::string& b, const std::string& where, std::size_t& data_offset) {
  auto bad = [&](const std::string& why) { bad_npy(where, why); };
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) bad("no npy magic");
  const unsigned major = static_cast<unsigned char>(b[6]);
  std::size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = std::size_t(static_cast<unsigned char>(b[8])) | std::size_t(static_cast<unsigned char>(b[9])) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) bad("truncated header");
    for (int k = 0; k < 4; ++k) header_len |= std::size_t(static_cast<unsigned char>(b[8 + k])) << (8 * k);
    offset = 12;
  } else {
    bad("unknown version " + std::to_string(major));
  }
  if (header_len > b.size() - offset) bad("header of " + std::to_string(header_len) + " bytes in a file of " +
                                          std::to_string(b.size()));
  data_offset = offset + header_len;
  return b.substr(offset, header_len);
}

}  // namespace

std::string npy_dtype(const std::string& b, const std::string& where) {
  std::size_t offset = 0;
  std::string descr = npy_field(npy_header(b, where, offset), "descr");
  if (descr.size() < 3 || descr.front() != '\'' || descr.back() != '\'')
    bad_npy(where, "dtype " + (descr.empty() ? std::string("missing") : descr));
  return descr.substr(1, descr.size() - 2);
}

template <class T>
ArrayT<T> read_npy(const std::string& b, const std::string& where) {
  auto bad = [&](const std::string& why) { bad_npy(where, why); };
  std::size_t offset = 0;
  const std::string header = npy_header(b, where, offset);
  const std::string want = std::is_same_v<T, std::int64_t> ? "'<i8'" : sizeof(T) == 4 ? "'<f4'" : "'<f8'";
  const std::string descr = npy_field(header, "descr");
  if (descr != want) bad("dtype " + (descr.empty() ? std::string("missing") : descr) + ", expected " + want);
  if (npy_field(header, "fortran_order") != "False") bad("not in C order");
  const std::string shape_text = npy_field(header, "shape");
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')') bad("no shape");
  Shape shape;
  std::size_t count = 1;
  std::string digits;
  for (std::size_t i = 1; i + 1 <= shape_text.size(); ++i) {
    const char c = i + 1 == shape_text.size() ? ',' : shape_text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (digits.size() >= 12) bad("a dimension is too large");
      digits.push_back(c);
    } else if (c == ',') {
      if (digits.empty()) {
        if (i + 1 == shape_text.size()) break;  // the trailing comma of (n,)
        bad("malformed shape " + shape_text);
      }
      const std::size_t n = std::stoull(digits);
      digits.clear();
      if (n != 0 && count > (std::size_t(1) << 40) / n) bad("shape " + shape_text + " is too large");
      count *= n;
      shape.push_back(n);
      if (shape.size() > 16) bad("more than 16 dimensions");
    } else if (c != ' ') {
      bad("malformed shape " + shape_text);
    }
  }
  if (count * sizeof(T) != b.size() - offset)
    bad("shape " + shape_text + " needs " + std::to_string(count * sizeof(T)) + " bytes of data, the file holds " +
        std::to_string(b.size() - offset));
  ArrayT<T> a = ArrayT<T>::from_shape(shape);
  if (count) std::memcpy(a.data(), b.data() + offset, count * sizeof(T));
  return a;
}

template ArrayT<float> read_npy<float>(const std::string&, const std::string&);
template ArrayT<double> read_npy<double>(const std::string&, const std::string&);
template ArrayT<std::int64_t> read_npy<std::int64_t>(const std::string&, const std::string&);

}  // namespace dpgrad
