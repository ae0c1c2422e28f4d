// What dpgrad-train and dpgrad-tune both do between loading a dataset and
// building a bundled model for it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include <fmt/core.h>

#include "data/datasets.hpp"
#include "engine/check.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"

namespace dpgrad {

/// Refuses a model that reads text on a dataset of images, or the reverse.
inline void require_model_reads(ModelInput input, const data::DataSplit& s, const std::string& model,
                                const std::string& dataset) {
  require(s.tokens == (input == ModelInput::tokens),
          model + (s.tokens ? " reads images, and " + dataset + " is text" : " reads text, and " + dataset + " holds images"));
}

/// A model of scattering features: computes them for both splits (fixed and data-independent: once, no privacy
/// cost) and says how long it took; other models read the data as it is.
inline void compute_model_inputs(ModelInput input, data::DataSplit& s, const std::function<void(const std::string&)>& say) {
  if (input != ModelInput::scattering) return;
  const auto t = std::chrono::steady_clock::now();
  s.train.inputs = scattering_inputs(s.train.inputs);
  s.test.inputs = scattering_inputs(s.test.inputs);
  say(fmt::format("scattering features (J = 2, L = 8) of {} train and {} test images: {} in {:.0f} s", s.train.size(),
                  s.test.size(), shape_str(shape_of(s.train.inputs)),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count()));
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
