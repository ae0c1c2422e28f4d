// libFuzzer harness: dpgrad-tune's option parsing, its trial counts and ranges (no search).
#include <stdexcept>

#include "programs/tune/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-tune", data, size);
  dpgrad::tune_cli::Options o;
  try {
    if (!dpgrad::tune_cli::parse_tune_options(args.argc(), args.argv(), o)) args.require_no_empty_number();
  } catch (const std::invalid_argument&) {
    args.require_no_empty_number();  // the checks after parsing must not have seen one either
  }
  return 0;
}
