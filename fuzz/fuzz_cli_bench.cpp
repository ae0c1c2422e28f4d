// libFuzzer harness: dpgrad-bench's option parsing and checks (nothing measured);
// no option that holds numbers may take an empty value (fuzz/cli_args.hpp).
#include <stdexcept>

#include "bench/options.hpp"
#include "fuzz/cli_args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dpgrad::fuzz::Argv args("dpgrad-bench", data, size);
  const auto parsed = dpgrad::bench::parse_bench_options(args.argc(), args.argv());
  if (parsed.exit_code) return 0;
  args.require_no_empty_number();
  try {
    dpgrad::bench::check_bench_options(parsed.options);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
