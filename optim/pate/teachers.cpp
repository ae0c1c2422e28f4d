// PATE's teachers (optim/pate/teachers.hpp, docs/pate.md).
#include "optim/pate/teachers.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "optim/dp_optimizer.hpp"
#include "optim/optimizer.hpp"
#include "optim/run/private_trainer.hpp"

namespace dpgrad {

std::size_t pate_teacher_of(const HashKey& key, std::int64_t id, std::size_t teachers) {
  return keyed_bucket(key, id, teachers);
}

std::vector<std::vector<std::size_t>> pate_partition(const std::vector<std::int64_t>& ids, const HashKey& key,
                                                     std::size_t teachers) {
  if (teachers == 0) throw std::invalid_argument("PATE: the number of teachers must be >= 1");
  if (ids.size() < teachers)
    throw std::invalid_argument("PATE: " + std::to_string(teachers) + " teachers need at least as many records; the "
                                "training set has " + std::to_string(ids.size()));
  std::unordered_set<std::int64_t> seen;
  std::vector<std::vector<std::size_t>> parts(teachers);
  for (std::size_t row = 0; row < ids.size(); ++row) {
    if (!seen.insert(ids[row]).second)
      throw std::invalid_argument("PATE: record id " + std::to_string(ids[row]) +
                                  " appears twice; one record must belong to one teacher");
    parts[pate_teacher_of(key, ids[row], teachers)].push_back(row);
  }
  return parts;
}

void pate_train(const PateTraining& how, const BatchT<float>& data, std::uint64_t seed,
                const std::function<void(PrivateTrainerT<float>&)>& use) {
  if (!how.make_model) throw std::invalid_argument("PATE: no model to train (PateTraining::make_model)");
  if (data.examples() == 0) throw std::invalid_argument("PATE: a model needs at least one example to train on");
  FastRng init(seed);
  std::unique_ptr<ModelT<float>> model = how.make_model(init);
  Sgd sgd(model->parameters(), how.lr, how.momentum);
  PrivateTrainingConfig c;
  c.non_private = true;
  c.epochs = how.epochs;
  c.batch_size = std::min(how.batch_size, data.examples());
  c.seed = seed;
  PrivateTrainer trainer(*model, sgd, data, c);
  trainer.train();
  if (use) use(trainer);
}

std::vector<std::int32_t> top_classes(const ArrayT<float>& outputs) {
  if (outputs.dimension() != 2) throw std::invalid_argument("top_classes: outputs must be (examples, classes)");
  const std::size_t n = outputs.shape()[0], k = outputs.shape()[1];
  std::vector<std::int32_t> top(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = outputs.data() + i * k;
    top[i] = std::int32_t(std::max_element(row, row + k) - row);
  }
  return top;
}

ArrayT<double> pate_teacher_votes(const PateTraining& how, const BatchT<float>& train,
                                  const std::vector<std::vector<std::size_t>>& parts, const BatchT<float>& pool,
                                  std::size_t classes, const std::function<void(std::size_t, std::size_t)>& progress) {
  if (classes == 0) throw std::invalid_argument("PATE: classes must be >= 1");
  ArrayT<double> votes = xt::zeros<double>({pool.examples(), classes});
  for (std::size_t t = 0; t < parts.size(); ++t) {
    if (parts[t].empty()) throw std::invalid_argument("PATE: teacher " + std::to_string(t) + " has no records");
    try {
      pate_train(how, train.select(parts[t]), how.seed + t, [&](PrivateTrainer& trainer) {
        const std::vector<std::int32_t> top = top_classes(trainer.predict(pool));
        for (std::size_t i = 0; i < top.size(); ++i) {
          if (std::size_t(top[i]) >= classes)
            throw std::invalid_argument("PATE: a teacher answered class " + std::to_string(top[i]) + " of " +
                                        std::to_string(classes));
          votes(i, std::size_t(top[i])) += 1;
        }
      });
    } catch (const DivergedError&) {
      // an abstaining teacher changes the vote histogram by at most what GNMax's sensitivity allows
      // (one vote removed rather than moved), and stopping the run would reveal its private part's effect
    }
    if (progress) progress(t + 1, parts.size());
  }
  return votes;
}

}  // namespace dpgrad
