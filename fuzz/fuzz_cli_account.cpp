// libFuzzer harness: dpgrad-account's option parsing and checks (no accounting).
#include <stdexcept>

#include "programs/account/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-account", data, size);
  try {
    dpgrad::account::parse_account_options(args.argc(), args.argv());
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
