// dpgrad-audit's options: parsed and checked before any trial runs.
#pragma once

#include <optional>

#include "optim/audit/audit_config.hpp"

namespace dpgrad::audit {

struct Parsed {
  AuditConfig config;
  bool json = false;
  std::optional<int> exit_code;  // --help (0) or a command-line error (2): exit with it
};

/// Parses and checks dpgrad-audit's flags; throws std::invalid_argument naming
/// the problem. Never exits the process.
Parsed parse_audit_options(int argc, const char* const* argv);

}  // namespace dpgrad::audit
