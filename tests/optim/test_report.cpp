// optim/run/report.hpp: a run's records and lines hold what epsilon covers, the
// training loss of a private run only when asked for (and labelled), and the
// summary names the mechanism, the releases before training and the last save.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "engine/random.hpp"
#include "layers/models.hpp"
#include "optim/run/private_trainer.hpp"
#include "optim/run/report.hpp"
#include "support/check.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
using json = nlohmann::json;

namespace {

BatchT<float> labelled(std::size_t n, Rng& rng) {
  BatchT<float> b;
  b.inputs = test::randn<float>({n, 6}, rng);
  for (std::size_t i = 0; i < n; ++i) {
    b.labels.push_back(b.inputs(i, 0) > 0 ? 1 : 0);
    b.ids.push_back(std::int64_t(i));
  }
  return b;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A one-layer model on `n` labelled records, with its optimizer: what a trainer refers to.
struct Small {
  FastRng init{3}, data{4};
  BatchT<float> train;
  std::unique_ptr<ModelT<float>> model;
  SgdT<float> sgd;
  explicit Small(std::size_t n)
      : train(labelled(n, data)), model(make_mlp<float>({6, 2}, Activation::relu, init)), sgd(model->parameters(), 0.2f) {}
};

/// Trains `c` for its epochs on 400 records, recording every epoch; returns the history.
json run(PrivateTrainingConfig c, const ReportOptions& options, json* summary, std::string* summary_line,
         std::string* last_line) {
  Small s(400);
  const BatchT<float> test_set = labelled(100, s.data);
  PrivateTrainer t(*s.model, s.sgd, s.train, c);
  json history = json::array();
  TrainHooksT<float> hooks;
  hooks.record_epoch = [&](const EpochReport& e) { history.push_back(epoch_record(t, e, options)); };
  hooks.on_epoch = [&](const EpochReport&) { *last_line = epoch_text(t, history.back()); };
  const TrainResult r = t.train(hooks, &test_set);
  *summary = summary_record(t, r, history.back(), 1.5);
  *summary_line = summary_text(t, *summary);
  return history;
}

}  // namespace

TEST_CASE("report: a private run's records hold epsilon, and its training loss only when asked, labelled") {
  PrivateTrainingConfig c;
  c.target_epsilon = 2;
  c.delta = 1e-4;
  c.epochs = 2;
  c.batch_size = 40;
  c.reproducible_noise = true;
  c.seed = 9;
  json summary;
  std::string final_line, line;
  json h = run(c, {}, &summary, &final_line, &line);
  REQUIRE(h.size() == 2);
  CHECK(h[1]["epoch"] == 2);
  CHECK(h[1]["steps"] == 20);
  CHECK(h[1]["test_accuracy"].is_number());
  CHECK(h[1]["epsilon"].get<double>() <= 2.0);
  CHECK(h[1]["epsilon"].get<double>() > h[0]["epsilon"].get<double>());
  CHECK_FALSE(h[1].contains("train_loss"));
  CHECK_FALSE(h[1].contains("train_loss_not_covered_by_epsilon"));
  CHECK_FALSE(h[1].contains("clip_norm"));  // C is fixed
  CHECK(has(line, "epoch 2/2: test accuracy "));
  CHECK(has(line, "epsilon "));
  CHECK_FALSE(has(line, "train loss"));
  CHECK(summary["final"] == true);
  CHECK(summary["status"] == "complete");
  CHECK(summary["steps"] == 20);
  CHECK(summary["total_seconds"] == 1.5);
  CHECK(summary["clip_strategy"] == "ghost");
  CHECK(summary["noise_multiplier"].get<double>() > 0);
  CHECK(summary["sampling_rate"] == doctest::Approx(0.1));
  CHECK(summary["private"] == false);  // reproducible noise: the statement says so
  CHECK_FALSE(summary.contains("checkpoint"));
  CHECK(has(final_line, "final: test accuracy "));
  CHECK(has(final_line, " after 20 steps in 1.5s"));
  CHECK(has(final_line, "not private"));

  // the labels below need no calibration (each took a third of the case's time): the first run's sigma, no target
  c.noise_multiplier = summary["noise_multiplier"].get<double>();
  c.target_epsilon.reset();
  json with_loss = run(c, {true, false}, &summary, &final_line, &line);
  CHECK(with_loss[1].contains("train_loss_not_covered_by_epsilon"));
  CHECK_FALSE(with_loss[1].contains("train_loss"));
  CHECK(has(line, "train loss (not covered by epsilon) "));

  json snr = run(c, {false, true}, &summary, &final_line, &line);
  REQUIRE(snr[1].contains("layer_snr"));
  CHECK(snr[1]["layer_snr"].size() == 1);  // the one dense layer
  CHECK(has(line, "\n  signal/noise per coordinate of the noised gradient: "));
}

TEST_CASE("report: a non-private run shows its training loss; adaptive clipping, releases and saves are in the summary") {
  json summary;
  std::string final_line, line;
  PrivateTrainingConfig plain;
  plain.non_private = true;
  plain.epochs = 1;
  plain.batch_size = 40;
  json h = run(plain, {}, &summary, &final_line, &line);
  CHECK(h[0].contains("train_loss"));
  CHECK_FALSE(h[0].contains("epsilon"));
  CHECK(has(line, "train loss "));
  CHECK(has(final_line, "(non-private)"));
  CHECK_FALSE(summary.contains("noise_multiplier"));
  CHECK(summary["private"] == false);

  test::TempDir dir;
  PrivateTrainingConfig c;
  c.noise_multiplier = 1.0;
  c.delta = 1e-4;
  c.epochs = 1;
  c.batch_size = 40;
  c.adaptive_clipping = AdaptiveClipping{0.5, 0, 0.2};
  c.checkpoints.dir = dir.path / "run";
  c.checkpoints.key_store = dir.path / "keys";
  c.releases.push_back(private_feature_mean<float>(
      6, 1.0, 8.0, [](const BatchT<float>& r) { return ArrayT<float>(r.inputs); }, [](const ArrayT<float>&) {}));
  h = run(c, {}, &summary, &final_line, &line);
  CHECK(h[0]["clip_norm"].get<double>() > 0);
  CHECK(has(line, "clip norm now "));
  CHECK(summary["clip_norm"] == h[0]["clip_norm"]);
  CHECK(summary["releases_before_training"]["feature_mean"] == 8.0);
  CHECK(summary["checkpoint"] == 10);
}

TEST_CASE("report: epoch_progress shows each epoch's steps, and nothing when quiet") {
  Small s(400);
  PrivateTrainingConfig c;
  c.non_private = true;
  c.batch_size = 200;
  c.epochs = 2;
  PrivateTrainer t(*s.model, s.sgd, s.train, c);
  REQUIRE(t.steps_per_epoch() == 2);
  const auto steps = [](const std::function<void(long, long)>& hook) {
    for (long done = 1; done <= 3; ++done) hook(done, 3);
  };
  const std::string shown = test::captured_stderr([&] { steps(epoch_progress(t)); });
  CHECK(has(shown, "epoch   1 step 1/2"));
  CHECK(has(shown, "epoch   1 step 2/2"));
  CHECK(has(shown, "epoch   2 step 1/1"));  // the last epoch holds what is left of the run
  CHECK(test::captured_stderr([&] { steps(epoch_progress(t, true)); }).empty());
}

TEST_CASE("report: a diverged step's message and record say what was spent") {
  Small s(200);
  PrivateTrainingConfig c;
  c.noise_multiplier = 1.0;
  c.delta = 1e-4;
  c.batch_size = 40;
  PrivateTrainer t(*s.model, s.sgd, s.train, c);
  t.step();
  const std::string message = diverged_message(t, std::runtime_error("the parameters diverged"));
  CHECK(has(message, "step 1: the parameters diverged; the run stops and releases nothing of it; epsilon spent"));
  const json row = diverged_record(t, message);
  CHECK(row["diverged"] == true);
  CHECK(row["steps"] == 1);
  CHECK(row["epsilon"].get<double>() > 0);
  CHECK(has(plot_title(t, "logreg", "synthetic", "dp-sgd"), "logreg on synthetic, dp-sgd (ghost, sigma 1); epsilon "));
}

TEST_CASE("report: plot_history refuses a path that is not a regular file, before gnuplot runs") {
  test::TempDir dir;
  const json history = json::array({json{{"epoch", 1}, {"test_accuracy", 0.5}, {"epsilon", 1.0}}});
  std::filesystem::create_directory(dir.path / "folder");
  const std::string refused = "--plot " + (dir.path / "folder").string() + " is a folder";
  CHECK_THROWS_WITH_AS(plot_history((dir.path / "folder").string(), history, "t", "--plot"),
                       doctest::Contains(refused.c_str()), std::invalid_argument);
  try {
    require_gnuplot();
  } catch (const std::invalid_argument& e) {
    MESSAGE("gnuplot is not installed here: the PNG itself is not drawn (" << e.what() << ")");
    return;
  }
  const auto png = dir.path / "history.png";
  plot_history(png.string(), history, "a title\nwith a control character");
  std::ifstream in(png, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  CHECK(std::string(magic + 1, 3) == "PNG");
}
