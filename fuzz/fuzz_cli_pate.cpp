// libFuzzer harness: dpgrad-pate's option parsing and checks (no data read).
#include <stdexcept>

#include "programs/pate/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-pate", data, size);
  try {
    if (!dpgrad::pate::parse_pate_options(args.argc(), args.argv()).exit_code) args.require_no_empty_number();
  } catch (const std::invalid_argument&) {
    args.require_no_empty_number();  // the checks after parsing must not have seen one either
  }
  return 0;
}
