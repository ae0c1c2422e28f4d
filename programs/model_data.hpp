// What dpgrad-train and dpgrad-tune both do between loading a dataset and
// building a bundled model for it.
#pragma once

#include <string>

#include "data/datasets.hpp"
#include "engine/check.hpp"
#include "layers/registry.hpp"

namespace dpgrad {

/// Refuses a model that reads text on a dataset of images, or the reverse.
inline void require_model_reads(ModelInput input, const data::DataSplit& s, const std::string& model,
                                const std::string& dataset) {
  require(s.tokens == (input == ModelInput::tokens),
          model + (s.tokens ? " reads images, and " + dataset + " is text" : " reads text, and " + dataset + " holds images"));
}

/// A ModelSpec sized by the data: its classes, values per example (images) or sequence length (text).
inline ModelSpec model_spec_of(const data::DataSplit& s) {
  ModelSpec spec;
  spec.classes = s.classes;
  spec.features = s.tokens ? 0 : s.train.inputs.size() / s.train.examples();
  spec.length = s.tokens ? s.train.tokens.shape()[1] : 0;
  return spec;
}

}  // namespace dpgrad
