// The bundled models by name: one table (name, help line, what the model reads,
// which settings it takes) that dpgrad-train, dpgrad-bench, dpgrad-audit,
// dpgrad-pate and their help texts all read, and build_model(), which makes any
// of them from a ModelSpec (docs/library.md). The table itself needs no layer
// code, so option checks can use it alone.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "layers/dense.hpp"

namespace dpgrad {

/// What a model reads from a batch.
enum class ModelInput {
  images,      // batch.inputs: images (B, 1, H, W) or flat features (mlp, logreg)
  tokens,      // batch.tokens (B, L) and batch.lengths
  scattering,  // batch.inputs: the images' scattering features (B, 7, 7, 81), computed once (scattering_inputs)
};

/// A bundled model.
struct ModelEntry {
  const char* name;           // what find_model and build_model take, e.g. "cnn26k"
  const char* help;           // one line for --help
  ModelInput input;           // what the model reads from a batch
  bool takes_activation;      // ModelSpec::activation applies
  bool takes_vocabulary;      // ModelSpec::vocabulary may be other than 8185
  bool takes_frozen_embedding;  // ModelSpec::train_embedding may be false
  bool takes_centre;          // ModelSpec::centred applies (private feature centring)
};

/// Every bundled model, in the order help texts list them.
const std::vector<ModelEntry>& model_registry();
/// The entry called `name`; throws std::invalid_argument listing the names.
const ModelEntry& find_model(const std::string& name);
/// "mlp, logreg, cnn26k, ..." for messages.
std::string model_list();
/// One line per model, "  name: help", for --help.
std::string model_help();

/// What a bundled model is built for: the data's sizes and the run's choices.
/// Each model reads the fields its entry says it takes.
struct ModelSpec {
  std::size_t classes = 10;          // outputs
  std::size_t features = 784;        // mlp and logreg: values per example
  std::size_t length = 150;          // transformer: padded sequence length
  std::size_t vocabulary = 8185;     // token models: token ids (padding and unknown included)
  Activation activation = Activation::relu;
  std::size_t hidden = 256;          // mlp: hidden units
  bool train_embedding = true;       // transformer: false keeps the table at its random initialisation
  bool centred = false;              // scatter models: a CentreT after the GroupNorm, its centre set later
};

/// The model `name` for `spec`, initialised from `rng`. Throws
/// std::invalid_argument for an unknown name or a setting the model does not take.
template <class T>
std::unique_ptr<ModelT<T>> build_model(const std::string& name, const ModelSpec& spec, Rng& rng);

}  // namespace dpgrad
