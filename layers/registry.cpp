// The table of bundled models (layers/registry.hpp): names, help and what each reads.
#include "layers/registry.hpp"

#include "layers/models.hpp"

#include <stdexcept>

namespace dpgrad {

const std::vector<ModelEntry>& model_registry() {
  static const std::vector<ModelEntry> table = {
      {"mlp", "Flatten; Dense(--hidden) act; Dense(classes): images or features", ModelInput::images, true, false,
       false, false},
      {"logreg", "Flatten; Dense(classes): multinomial logistic regression", ModelInput::images, false, false, false,
       false},
      {"cnn26k", "2 convolutions, 2 max-pools, Dense(32), Dense(10): 26,010 parameters on 28x28 images",
       ModelInput::images, true, false, false, false},
      {"cnn17m", "cnn26k's convolutions with a Dense(32768): 17,146,938 parameters", ModelInput::images, true, false,
       false, false},
      {"bilstm598k", "Embedding(8185, 64), bidirectional LSTM(64), Dense(64), Dense(classes): 598,274 parameters",
       ModelInput::tokens, false, false, false, false},
      {"bigru", "Embedding(8185, 64), bidirectional GRU(64), Dense(classes)", ModelInput::tokens, false, false, false,
       false},
      {"transformer", "2 pre-LN blocks (d 64, 4 heads, MLP 256) over hashed tokens (--vocabulary), learned positions",
       ModelInput::tokens, false, true, true, false},
      {"scatter-linear", "GroupNorm and Dense(classes) on the images' scattering features (J = 2, L = 8)",
       ModelInput::scattering, false, false, false, true},
      {"scatter-cnn", "GroupNorm, a small CNN and Dense(classes) on the images' scattering features",
       ModelInput::scattering, true, false, false, true},
  };
  return table;
}

std::string model_list() {
  std::string s;
  for (const auto& m : model_registry()) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

std::string model_help() {
  std::string s;
  for (const auto& m : model_registry()) s += "  " + std::string(m.name) + ": " + m.help + "\n";
  return s;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& m : model_registry()) names.push_back(m.name);
  return names;
}

bool model_reads_tokens(const std::string& name) { return find_model(name).input == ModelInput::tokens; }

bool model_reads_scattering(const std::string& name) { return find_model(name).input == ModelInput::scattering; }

const ModelEntry& find_model(const std::string& name) {
  for (const auto& m : model_registry())
    if (name == m.name) return m;
  throw std::invalid_argument("unknown model '" + name + "' (" + model_list() + ")");
}

}  // namespace dpgrad
