// The names of the bundled models and what each reads (layers/models.hpp), in a
// file of their own so that option checks can use them without the layers.
#include "layers/models.hpp"

namespace dpgrad {

std::vector<std::string> model_names() {
  return {"mlp", "cnn26k", "cnn17m", "bilstm598k", "bigru", "transformer", "scatter-linear", "scatter-cnn"};
}

bool model_reads_tokens(const std::string& name) {
  return name == "bilstm598k" || name == "bigru" || name == "transformer";
}

bool model_reads_scattering(const std::string& name) { return name == "scatter-linear" || name == "scatter-cnn"; }

}  // namespace dpgrad
