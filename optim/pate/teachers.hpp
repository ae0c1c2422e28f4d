// PATE's teachers (Papernot et al. 2017, 2018; docs/pate.md): the private
// training set split into disjoint parts by a keyed hash of each record's
// identity, one model trained non-privately on each part, and their votes on
// public, unlabelled examples. The votes go to privacy/pate.hpp's aggregators.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/array.hpp"
#include "engine/random.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// The teacher of record `id`: SipHash-2-4(key, id) mod teachers. It depends on
/// the id and the key alone, so adding or removing one record changes one
/// teacher's part and no other.
std::size_t pate_teacher_of(const HashKey& key, std::int64_t id, std::size_t teachers);

/// The rows of a data set with record ids `ids` that each teacher trains on.
/// Throws std::invalid_argument if teachers == 0, ids are missing (empty while
/// rows exist) or repeated, or there are fewer records than teachers.
std::vector<std::vector<std::size_t>> pate_partition(const std::vector<std::int64_t>& ids, const HashKey& key,
                                                     std::size_t teachers);

/// How each teacher (or the student) is trained: non-privately, SGD with momentum.
struct PateTraining {
  std::function<std::unique_ptr<ModelT<float>>(Rng& init)> make_model;  // a fresh model drawn from `init`; required
  double epochs = 40;
  std::size_t batch_size = 32;
  double lr = 0.05;
  double momentum = 0.9;
  std::uint64_t seed = 1;  // initialisation and data order (public randomness)
};

template <class T>
class PrivateTrainerT;

/// Trains a new model by `how` on `data` (every example with its label), with
/// `seed` for its initialisation and data order, then calls use(trainer).
void pate_train(const PateTraining& how, const BatchT<float>& data, std::uint64_t seed,
                const std::function<void(PrivateTrainerT<float>&)>& use);

/// Votes (pool examples, classes): teachers trained one after another on their
/// parts of `train` (only one in memory at a time), each adding one vote for its
/// top class on every example of `pool`. A teacher whose training diverges
/// (DivergedError) abstains: it adds no vote, and nothing says so, since whether
/// it diverged depends on its private part (docs/pate.md). progress(teachers
/// done, teachers).
ArrayT<double> pate_teacher_votes(const PateTraining& how, const BatchT<float>& train,
                                  const std::vector<std::vector<std::size_t>>& parts, const BatchT<float>& pool,
                                  std::size_t classes, const std::function<void(std::size_t, std::size_t)>& progress = {});

/// The top class of each row of outputs (examples, classes), ties to the lowest.
std::vector<std::int32_t> top_classes(const ArrayT<float>& outputs);

}  // namespace dpgrad
