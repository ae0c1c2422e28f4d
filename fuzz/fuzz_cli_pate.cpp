// libFuzzer harness: dpgrad-pate's option parsing and checks (no data read).
#include <stdexcept>

#include "programs/pate/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-pate", data, size);
  try {
    dpgrad::pate::parse_pate_options(args.argc(), args.argv());
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
