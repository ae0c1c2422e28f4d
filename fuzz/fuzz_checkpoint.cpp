// libFuzzer harness: what a checkpoint reader parses - npy arrays, and the
// accountants' ledgers (every accountant's from_json) - on any bytes.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "optim/checkpoint/npy.hpp"
#include "privacy/accountant.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    dpgrad::read_npy<float>(bytes, "fuzz");
  } catch (const std::invalid_argument&) {
  }
  try {
    dpgrad::read_npy<double>(bytes, "fuzz");
  } catch (const std::invalid_argument&) {
  }
  const nlohmann::json j = nlohmann::json::parse(bytes, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    auto a = dpgrad::privacy::accountant_from_json(j);
    if (a->total_steps() < 50) a->epsilon(1e-5);  // a ledger that loads is also read (bounded work)
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
