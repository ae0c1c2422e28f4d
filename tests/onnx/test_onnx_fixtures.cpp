// ONNX models exported from PyTorch (tests/fixtures/onnx/, made by hand with
// make_fixtures.py): forward outputs against PyTorch's, per-example gradients
// and norms of the naive, vanilla and ghost routes against PyTorch's
// per-example loop, clipped sums, jl:3's law, freezing, and export/re-import.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/random.hpp"
#include "engine/tape.hpp"
#include "onnx/onnx.hpp"
#include "optim/clipping/check_per_sample.hpp"
#include "optim/clipping/clipping.hpp"
#include "optim/checkpoint/npy.hpp"
#include "optim/optimizer.hpp"
#include "support/check.hpp"
#include "support/jl.hpp"
#include "support/temp_dir.hpp"

using namespace dpgrad;
namespace fs = std::filesystem;

namespace {

const char* const kFixtures = DPGRAD_ONNX_FIXTURES;
const std::vector<std::string> kModels = {"mlp", "cnn", "bilstm", "gru", "transformer", "transformer17", "misc"};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A fixture's files; absent: a skipped test, or a failure in CI.
struct Fixture {
  std::string dir, model;
  bool tokens = false;
  ArrayT<double> inputs64;
  ArrayT<std::int64_t> tokens64;
  std::vector<std::int32_t> labels;
  ArrayT<float> logits;
  ArrayT<double> logits64, norms;
  std::vector<std::pair<std::string, ArrayT<double>>> grads;  // initializer -> (B, ...)

  template <class T>
  BatchT<T> batch() const {
    BatchT<T> b;
    if (tokens) {
      b.tokens = ArrayT<std::int32_t>(xt::cast<std::int32_t>(tokens64));
      b.lengths.assign(tokens64.shape()[0], std::int32_t(tokens64.shape()[1]));
    } else {
      b.inputs = ArrayT<T>(xt::cast<T>(inputs64));
    }
    b.labels = labels;
    for (std::size_t i = 0; i < labels.size(); ++i) b.ids.push_back(std::int64_t(i));
    return b;
  }
  std::size_t size() const { return labels.size(); }
};

bool load_fixture(const std::string& name, Fixture& f) {
  f.dir = std::string(kFixtures) + "/" + name;
  f.model = f.dir + "/model.onnx";
  if (!fs::exists(f.model)) {
    if (std::getenv("CI")) FAIL("fixture missing: " << f.model);
    MESSAGE("skipped: fixture " << f.model << " not found");
    return false;
  }
  const std::string in = slurp(f.dir + "/inputs.npy");
  f.tokens = in.find("'<i8'") != std::string::npos;
  if (f.tokens) f.tokens64 = read_npy<std::int64_t>(in, "inputs.npy");
  else f.inputs64 = xt::cast<double>(read_npy<float>(in, "inputs.npy"));
  for (auto v : read_npy<std::int64_t>(slurp(f.dir + "/labels.npy"), "labels.npy")) f.labels.push_back(std::int32_t(v));
  f.logits = read_npy<float>(slurp(f.dir + "/logits.npy"), "logits.npy");
  f.logits64 = read_npy<double>(slurp(f.dir + "/logits64.npy"), "logits64.npy");
  f.norms = read_npy<double>(slurp(f.dir + "/norms.npy"), "norms.npy");
  std::ifstream list(f.dir + "/grads.txt");
  std::size_t k;
  std::string init;
  while (list >> k >> init)
    f.grads.push_back({init, read_npy<double>(slurp(f.dir + "/grad_" + std::to_string(k) + ".npy"), "grad")});
  return true;
}

/// ||a - b|| / ||b|| over each example's block of (B, ...).
double worst_relative(const ArrayT<double>& a, const ArrayT<double>& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const std::size_t batch = a.shape()[0], n = batch ? a.size() / batch : 0;
  double worst = 0;
  for (std::size_t i = 0; i < batch; ++i) {
    double d = 0, s = 0;
    for (std::size_t e = 0; e < n; ++e) {
      const double x = a.data()[i * n + e], y = b.data()[i * n + e];
      d += (x - y) * (x - y);
      s += y * y;
    }
    worst = std::max(worst, std::sqrt(d) / std::max(std::sqrt(s), 1e-300));
  }
  return worst;
}

/// Checks per-initializer arrays (B, ...) against the fixture's.
void check_gradients(const Fixture& f, const std::vector<std::pair<std::string, ArrayT<double>>>& got,
                     const std::string& route, double tol) {
  CAPTURE(route);
  REQUIRE(got.size() == f.grads.size());
  for (const auto& [name, want] : f.grads) {
    CAPTURE(name);
    const auto it = std::find_if(got.begin(), got.end(), [&](const auto& p) { return p.first == name; });
    REQUIRE(it != got.end());
    const double e = worst_relative(it->second, want);
    CHECK(e <= tol);
  }
}

/// Per-example gradients by the loop over examples: (B, ...) per trainable parameter.
std::vector<ArrayT<double>> naive_per_example(onnx::OnnxModelT<double>& model, const BatchT<double>& batch) {
  const auto ps = model.parameters();
  std::vector<ArrayT<double>> out;
  for (const auto& p : ps) {
    Shape s{batch.size()};
    for (auto d : p.shape()) s.push_back(d);
    out.push_back(xt::zeros<double>(s));
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    for (auto p : ps) p.zero_grad();
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    const BatchT<double> one = batch.select({i});
    tape.backward(sum(model.row_losses(model.forward(one), one)));
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const ArrayT<double>& g = ps[k].grad();
      std::copy(g.begin(), g.end(), out[k].begin() + std::ptrdiff_t(i * g.size()));
    }
  }
  for (auto p : ps) p.zero_grad();
  return out;
}

/// Per-example gradients by the engine's per-sample rules (what vanilla keeps).
std::vector<ArrayT<double>> rules_per_example(onnx::OnnxModelT<double>& model, const BatchT<double>& batch) {
  const auto ps = model.parameters();
  TapeT<double> tape;
  record_uses(tape, model, batch, ps);
  std::vector<ArrayT<double>> out;
  for (const auto* g : groups_by_param(tape, ps)) {
    REQUIRE(g != nullptr);
    out.push_back(per_sample_gradients(*g, batch.size()));
  }
  return out;
}

}  // namespace

TEST_CASE("onnx fixtures: forward outputs match PyTorch's (float within 1e-5, double within 1e-7)") {
  for (const auto& name : kModels) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    auto model = onnx::load<float>(f.model);
    model->set_training(false);
    NoRecordScope<float> none;
    const ArrayT<float> got = model->forward(f.batch<float>()).value();
    REQUIRE(got.shape() == f.logits.shape());
    const double scale = double(xt::amax(xt::abs(f.logits))());
    std::string diff = test::mismatch(got, f.logits, 1e-5, scale);
    INFO(diff);
    CHECK(diff.empty());
    auto model64 = onnx::load<double>(f.model);
    model64->set_training(false);
    NoRecordScope<double> none64;
    DPGRAD_CHECK_CLOSE(model64->forward(f.batch<double>()).value(), f.logits64, 1e-7);
    CHECK(model64->inexact_uses().empty());
  }
}

TEST_CASE("onnx fixtures: per-example gradients of the loop and of the per-sample rules match PyTorch's") {
  for (const auto& name : kModels) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    auto model = onnx::load<double>(f.model);
    model->set_training(false);
    const BatchT<double> batch = f.batch<double>();
    check_gradients(f, model->to_initializer_layout(naive_per_example(*model, batch)), "naive", 1e-7);
    check_gradients(f, model->to_initializer_layout(rules_per_example(*model, batch)), "rules", 1e-7);
  }
}

TEST_CASE("onnx fixtures: norms and clipped sums of naive, vanilla and ghost match PyTorch's per-example loop") {
  for (const auto& name : kModels) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    auto model = onnx::load<double>(f.model);
    model->set_training(false);
    const BatchT<double> batch = f.batch<double>();
    // C = the median norm: some examples clipped, some not
    std::vector<double> sorted(f.norms.begin(), f.norms.end());
    std::sort(sorted.begin(), sorted.end());
    const double C = sorted[sorted.size() / 2];
    // PyTorch's clipped sum, per initializer
    std::vector<std::pair<std::string, ArrayT<double>>> want;
    for (const auto& [init, g] : f.grads) {
      Shape s(g.shape().begin(), g.shape().end());
      s[0] = 1;
      ArrayT<double> acc = xt::zeros<double>(s);
      const std::size_t n = acc.size();
      for (std::size_t i = 0; i < f.size(); ++i) {
        const double c = std::min(1.0, C / f.norms(i));
        for (std::size_t e = 0; e < n; ++e) acc.data()[e] += c * g.data()[i * n + e];
      }
      want.push_back({init, acc});
    }
    for (const std::string route : {"naive", "vanilla", "ghost"}) {
      CAPTURE(route);
      FastRng rng(1);
      const auto r = make_clip_strategy<double>(route)->clipped_sum(*model, batch, C, rng);
      DPGRAD_CHECK_CLOSE(r.norms, f.norms, 1e-7);
      std::vector<ArrayT<double>> sums;
      for (const auto& s : r.sum) {
        Shape sh{1};
        for (auto d : s.shape()) sh.push_back(d);
        ArrayT<double> a = s;
        a.reshape(sh);
        sums.push_back(a);
      }
      const auto got = model->to_initializer_layout(sums);
      REQUIRE(got.size() == want.size());
      for (const auto& [init, w] : want) {
        CAPTURE(init);
        const auto it = std::find_if(got.begin(), got.end(), [&](const auto& p) { return p.first == init; });
        REQUIRE(it != got.end());
        CHECK(worst_relative(it->second, w) <= 1e-7);
      }
    }
    // and every exact route of the engine against its own per-example loop
    const PerSampleCheck check = check_per_sample(*model, batch);
    INFO(check.str());
    CHECK(check.agrees(1e-9));
  }
}

TEST_CASE("onnx fixtures: batches of one example (Poisson sampling draws them) stay exact") {
  for (const auto& name : kModels) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    auto model = onnx::load<double>(f.model);
    model->set_training(false);
    const BatchT<double> all = f.batch<double>();
    for (std::size_t i : {std::size_t(0), f.size() - 1}) {
      CAPTURE(i);
      const BatchT<double> one = all.select({i});
      for (const std::string route : {"vanilla", "ghost"}) {
        CAPTURE(route);
        FastRng rng(1);
        const auto r = make_clip_strategy<double>(route)->clipped_sum(*model, one, 1e9, rng);
        REQUIRE(r.norms.size() == 1);
        CHECK(r.norms(0) == doctest::Approx(f.norms(i)).epsilon(1e-7));
      }
    }
  }
}

TEST_CASE("onnx fixtures: jl:3 norm estimates follow chi2_3 / 3") {
  for (const std::string name : {"mlp", "cnn", "bilstm", "transformer"}) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    auto model = onnx::load<double>(f.model);
    model->set_training(false);
    FastRng rng(7);
    const test::JlLaw law = test::jl3_law(*model, f.batch<double>(), rng, 100);
    CAPTURE(law.ks);
    CAPTURE(law.mean);
    CHECK(law.ks < law.critical);
    CHECK(law.mean == doctest::Approx(1.0).epsilon(0.25));
  }
}

TEST_CASE("onnx fixtures: recovered parameter names, and freezing by either name") {
  Fixture f;
  if (!load_fixture("transformer", f)) return;
  auto model = onnx::load<double>(f.model);
  std::vector<std::string> names;
  for (const auto& p : model->parameter_info()) names.push_back(p.name);
  CAPTURE(names.size());
  // onnx::MatMul_384 is the first block's attention input weight; linear1's weight is named after its bias
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  CHECK(has("enc.layers.0.self_attn.in_proj_weight"));
  CHECK(has("enc.layers.0.linear1.weight"));
  CHECK(has("enc.layers.1.linear2.weight"));
  CHECK(has("fc.weight"));
  Fixture l;
  if (load_fixture("bilstm", l)) {
    auto lstm = onnx::load<double>(l.model);
    std::vector<std::string> ln;
    for (const auto& p : lstm->parameter_info()) ln.push_back(p.name);
    CHECK(std::find(ln.begin(), ln.end(), "lstm.weight_ih_l0") != ln.end());
    CHECK(std::find(ln.begin(), ln.end(), "lstm.bias_hh_l0_reverse") != ln.end());
  }
  // freeze by the recovered name, and by the file's name
  for (const std::string pattern : {"in_proj_weight", "onnx::MatMul_384"}) {
    CAPTURE(pattern);
    onnx::LoadOptions o;
    o.freeze = pattern;
    auto frozen = onnx::load<double>(f.model, o);
    std::size_t n_frozen = 0;
    for (const auto& p : frozen->parameter_info()) n_frozen += p.frozen;
    CHECK(n_frozen == (pattern == "in_proj_weight" ? 2u : 1u));
    CHECK(frozen->parameters().size() + n_frozen == model->parameters().size());
  }
}

TEST_CASE("onnx fixtures: a frozen tensor is a constant: no gradient, no share of the norm, unchanged by a step") {
  Fixture f;
  if (!load_fixture("cnn", f)) return;
  onnx::LoadOptions o;
  o.freeze = "^conv";
  auto model = onnx::load<double>(f.model, o);
  model->set_training(false);
  REQUIRE(model->parameters().size() == 2);  // fc.weight, fc.bias
  const BatchT<double> batch = f.batch<double>();
  // the norms are PyTorch's without the convolutions' share
  ArrayT<double> want = xt::zeros<double>({f.size()});
  for (const auto& [init, g] : f.grads) {
    if (init.rfind("conv", 0) == 0) continue;
    const std::size_t n = g.size() / f.size();
    for (std::size_t i = 0; i < f.size(); ++i)
      for (std::size_t e = 0; e < n; ++e) want(i) += g.data()[i * n + e] * g.data()[i * n + e];
  }
  want = xt::sqrt(want);
  for (const std::string route : {"naive", "vanilla", "ghost"}) {
    CAPTURE(route);
    FastRng rng(2);
    const auto r = make_clip_strategy<double>(route)->clipped_sum(*model, batch, 1e9, rng);
    DPGRAD_CHECK_CLOSE(r.norms, want, 1e-7);
    CHECK(r.sum.size() == 2);
  }
  // a step moves the trainable parameters only
  const auto before = model->all_values();
  SgdT<double> sgd(model->parameters(), 0.1);
  {
    TapeT<double> tape;
    RecordScope<double> scope(tape);
    tape.backward(sum(model->row_losses(model->forward(batch), batch)));
  }
  sgd.step();
  const auto after = model->all_values();
  const auto& info = model->parameter_info();
  for (std::size_t k = 0; k < info.size(); ++k) {
    CAPTURE(info[k].name);
    if (info[k].frozen) CHECK(xt::allclose(before[k], after[k], 0.0, 0.0));
    else CHECK_FALSE(xt::allclose(before[k], after[k], 0.0, 0.0));
  }
}

TEST_CASE("onnx fixtures: export writes the trained weights; re-import reproduces the outputs bit for bit") {
  test::TempDir dir("dpgrad-onnx");
  for (const auto& name : kModels) {
    CAPTURE(name);
    Fixture f;
    if (!load_fixture(name, f)) continue;
    onnx::LoadOptions o;
    o.freeze = name == "cnn" ? "conv1" : "";
    auto model = onnx::load<float>(f.model, o);
    model->set_training(false);
    // move every trainable parameter
    FastRng rng(3);
    for (auto p : model->parameters())
      for (auto& v : p.mutable_value()) v += float(0.01 * rng.normal());
    const std::string out = dir / (name + ".onnx");
    onnx::save(*model, out);
    auto again = onnx::load<float>(out, o);
    again->set_training(false);
    const BatchT<float> batch = f.batch<float>();
    NoRecordScope<float> none;
    const ArrayT<float> y0 = model->forward(batch).value(), y1 = again->forward(batch).value();
    REQUIRE(y0.shape() == y1.shape());
    CHECK(std::equal(y0.begin(), y0.end(), y1.begin()));
    const auto v0 = model->all_values(), v1 = again->all_values();
    REQUIRE(v0.size() == v1.size());
    for (std::size_t k = 0; k < v0.size(); ++k) CHECK(std::equal(v0[k].begin(), v0[k].end(), v1[k].begin()));
    // the graph is the file's: the same names and parameters
    CHECK(again->parameter_info().size() == model->parameter_info().size());
  }
}
