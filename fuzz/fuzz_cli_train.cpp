// libFuzzer harness: dpgrad-train's option parsing and checks. Help and
// errors print and return an exit code or throw std::invalid_argument; nothing
// may crash, exit or throw anything else, and no option that holds numbers may
// take an empty value (fuzz/cli_args.hpp).
#include <stdexcept>

#include "programs/train/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-train", data, size);
  auto parsed = dpgrad::train::parse_train_options(args.argc(), args.argv());
  if (parsed.exit_code) return 0;
  args.require_no_empty_number();
  try {
    dpgrad::train::check_train_options(parsed.options, parsed.given);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
