// libFuzzer harness: dpgrad-account's option parsing and checks (no accounting).
#include <stdexcept>

#include "programs/account/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-account", data, size);
  try {
    if (!dpgrad::account::parse_account_options(args.argc(), args.argv()).exit_code) args.require_no_empty_number();
  } catch (const std::invalid_argument&) {
    args.require_no_empty_number();  // the checks after parsing must not have seen one either
  }
  return 0;
}
