// The benchmark models: exact parameter counts, unique names, (B, classes)
// outputs, a gradient check of cnn26k, the per-sample uses its convolutions
// record, and the BiLSTM and BiGRU classifiers' handling of padding.
#include <set>

#include <doctest/doctest.h>

#include "engine/conv.hpp"
#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/models.hpp"
#include "layers/registry.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;

namespace {

template <class T>
BatchT<T> image_batch(std::size_t b, Rng& rng) {
  BatchT<T> batch;
  batch.inputs = randn<T>({b, 1, 28, 28}, rng);
  for (std::size_t i = 0; i < b; ++i) batch.labels.push_back(std::int32_t(i % 10));
  return batch;
}

template <class T>
BatchT<T> token_batch(std::vector<std::int32_t> lengths, std::size_t max_len, Rng& rng) {
  BatchT<T> batch;
  batch.tokens = xt::zeros<std::int32_t>({lengths.size(), max_len});
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    for (std::size_t t = 0; t < std::size_t(lengths[i]); ++t) batch.tokens(i, t) = std::int32_t(1 + rng.below(8184));
    batch.labels.push_back(std::int32_t(i % 2));
  }
  batch.lengths = std::move(lengths);
  return batch;
}

template <class T>
void check_unique_names(const ModelT<T>& m) {
  std::set<std::string> names;
  for (const auto& p : m.parameters()) {
    CHECK(p.is_parameter());
    CHECK(!p.name().empty());
    CHECK(names.insert(p.name()).second);
  }
}

std::vector<std::string> names_of(const ModelT<float>& m) {
  std::vector<std::string> r;
  for (const auto& p : m.parameters()) r.push_back(p.name());
  return r;
}

}  // namespace

TEST_CASE("models: exact parameter counts and names") {
  FastRng rng(61);
  auto mlp = make_mlp<float>({784, 256, 10}, Activation::relu, rng);
  CHECK(mlp->parameter_count() == 784 * 256 + 256 + 256 * 10 + 10);
  CHECK(mlp->name() == "mlp");
  check_unique_names(*mlp);

  auto cnn = make_cnn26k<float>(Activation::tanh, rng);
  CHECK(cnn->parameter_count() == 26010);
  CHECK(cnn->name() == "cnn26k");
  CHECK(names_of(*cnn) == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                                   "dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"});
  std::vector<std::size_t> sizes;
  for (const auto& p : cnn->parameters()) sizes.push_back(p.size());
  CHECK(sizes == std::vector<std::size_t>{1024, 16, 8192, 32, 16384, 32, 320, 10});

  auto big = make_cnn17m<float>(Activation::relu, rng);
  CHECK(big->parameter_count() == 17146938);
  check_unique_names(*big);

  auto lstm = make_bilstm598k<float>(rng);
  CHECK(lstm->parameter_count() == 598274);
  CHECK(lstm->name() == "bilstm598k");
  check_unique_names(*lstm);
  CHECK(lstm->parameters()[0].name() == "embedding.weight");
  CHECK(lstm->parameters()[0].shape() == Shape{8185, 64});

  // Embedding 8185 * 64; per GRU direction 3 gate blocks with two biases,
  // 64 * 192 + 64 * 192 + 192 + 192 = 24,960; Dense 128 * 2 + 2
  auto gru = make_bigru<float>(rng);
  CHECK(8185 * 64 + 2 * (64 * 192 + 64 * 192 + 192 + 192) + (128 * 2 + 2) == 574018);
  CHECK(gru->parameter_count() == 574018);
  CHECK(gru->name() == "bigru");
  check_unique_names(*gru);
  CHECK(names_of(*gru) == std::vector<std::string>{"embedding.weight", "bigru.forward.weight_ih",
                                                   "bigru.forward.weight_hh", "bigru.forward.bias_ih",
                                                   "bigru.forward.bias_hh", "bigru.backward.weight_ih",
                                                   "bigru.backward.weight_hh", "bigru.backward.bias_ih",
                                                   "bigru.backward.bias_hh", "dense.weight", "dense.bias"});
  CHECK(make_bigru<float>(rng, 20, 5, 4, 3)->parameter_count() == 20 * 5 + 2 * (5 * 12 + 4 * 12 + 12 + 12) + 8 * 3 + 3);

  CHECK(make_model<float>("cnn26k", rng)->parameter_count() == 26010);
  CHECK(make_model<float>("bilstm598k", rng)->parameter_count() == 598274);
  CHECK(make_model<float>("bigru", rng)->parameter_count() == 574018);
  CHECK(make_model<float>("mlp", rng, Activation::relu, {20, 5, 3})->parameter_count() == 20 * 5 + 5 + 5 * 3 + 3);
  CHECK(make_model<float>("transformer", rng)->parameter_count() == 633666);
  CHECK(make_model<float>("scatter-linear", rng)->parameter_count() == 39862);
  CHECK(make_model<float>("scatter-cnn", rng)->parameter_count() == 26412);
  CHECK(model_names() == std::vector<std::string>{"mlp", "logreg", "cnn26k", "cnn17m", "bilstm598k", "bigru",
                                                  "transformer", "scatter-linear", "scatter-cnn"});
  // the registry: every model has help, builds from a spec, and refuses settings it does not take
  for (const auto& m : model_registry()) CHECK(std::string(m.help).size() > 10);
  CHECK(model_help().find("  transformer: ") != std::string::npos);
  test::check_error<std::invalid_argument>([] { find_model("resnet"); }, {"unknown model 'resnet'", "mlp, logreg"});
  ModelSpec spec;
  spec.classes = 3;
  spec.features = 20;
  CHECK(build_model<float>("logreg", spec, rng)->parameter_count() == 20 * 3 + 3);
  spec.vocabulary = 100;
  test::check_error<std::invalid_argument>([&] { build_model<float>("bigru", spec, rng); }, {"bigru has an embedding of 8185 rows", "only the transformer"});
  test::check_error<std::invalid_argument>([&] { build_model<float>("mlp", spec, rng); }, {"mlp reads no tokens"});
  spec.length = 12;
  CHECK(build_model<float>("transformer", spec, rng)->name() == "transformer");
  spec.vocabulary = 8185;
  spec.centred = true;
  test::check_error<std::invalid_argument>([&] { build_model<float>("cnn26k", spec, rng); }, {"scatter models"});
  CHECK(model_reads_tokens("transformer"));
  CHECK(model_reads_scattering("scatter-cnn"));
  CHECK(!model_reads_scattering("cnn26k"));
  for (const auto& n : model_names()) CHECK(make_model<float>(n, rng)->name() == n);
  CHECK_THROWS_AS(make_model<float>("resnet", rng), std::invalid_argument);
  CHECK_THROWS_AS(make_mlp<float>({784}, Activation::relu, rng), std::invalid_argument);
}

TEST_CASE("models: a forward pass gives (B, classes)") {
  FastRng rng(62);
  NoRecordScope<float> none;
  for (const char* name : {"mlp", "cnn26k", "cnn17m"}) {
    CAPTURE(name);
    auto m = make_model<float>(name, rng);
    for (std::size_t b : {1, 3}) {
      Tensor y = m->forward(image_batch<float>(b, rng));
      CHECK(y.shape() == Shape{b, 10});
      CHECK(xt::all(xt::isfinite(y.value())));
    }
  }
  auto lstm = make_bilstm598k<float>(rng);
  Tensor y = lstm->forward(token_batch<float>({7, 3, 1}, 7, rng));
  CHECK(y.shape() == Shape{3, 2});
  CHECK(xt::all(xt::isfinite(y.value())));
  auto gru = make_bigru<float>(rng);
  Tensor yg = gru->forward(token_batch<float>({7, 3, 1}, 7, rng));
  CHECK(yg.shape() == Shape{3, 2});
  CHECK(xt::all(xt::isfinite(yg.value())));
  // bad input throws
  auto cnn = make_cnn26k<float>(Activation::relu, rng);
  BatchT<float> wrong;
  wrong.inputs = Array::from_shape({2, 1, 27, 28});
  CHECK_THROWS_AS(cnn->forward(wrong), std::invalid_argument);
  BatchT<float> no_tokens = image_batch<float>(2, rng);
  CHECK_THROWS_AS(lstm->forward(no_tokens), std::invalid_argument);
  CHECK_THROWS_WITH_AS(gru->forward(no_tokens), doctest::Contains("bigru: batch.tokens"), std::invalid_argument);
  BatchT<float> short_lengths = token_batch<float>({3, 2}, 4, rng);
  short_lengths.lengths.pop_back();
  CHECK_THROWS_AS(lstm->forward(short_lengths), std::invalid_argument);
  CHECK_THROWS_AS(gru->forward(short_lengths), std::invalid_argument);
}

TEST_CASE("cnn26k: gradient check on one image; conv1 records a direct conv use where its kernels are vectorised, conv2 an im2col use") {
  FastRng rng(63);
  auto m = make_cnn26k<double>(Activation::tanh, rng);
  BatchT<double> batch = image_batch<double>(1, rng);
  GradcheckOptions o;
  o.probes = 2;
  o.tangents = 2;
  // FeatureModelT::forward wraps batch.inputs in a constant: check through its network instead
  auto& net = dynamic_cast<FeatureModelT<double>&>(*m).net();
  DPGRAD_CHECK_GRADS(gradcheck(
      [&](const std::vector<TensorT<double>>& v) { return mean_cross_entropy(net.forward(v[0]), batch.labels); },
      {batch.inputs}, o));

  // per-sample records: conv1 (64 x 16 over 196 positions) is the direct op, a conv use over the
  // images themselves, where the direct kernels run with 32-byte vectors or wider (else a matmul use
  // over its patches, 14 x 14 rows of 64 per image); conv2 (256 x 32 over 25) one matmul use with
  // (Ho, Wo) patch rows per image
  BatchT<double> two = image_batch<double>(2, rng);
  for (auto& p : m->parameters()) p.zero_grad();
  TapeT<double> tape;
  tape.record_uses(true);
  {
    RecordScope<double> scope(tape);
    tape.backward(mean_cross_entropy(m->forward(two), two.labels));
  }
  const auto& groups = tape.uses();
  REQUIRE(groups.size() == 8);
  CHECK(groups[0].param->name == "conv1.weight");
  if (direct_conv_pays(64, 16, 196)) {
    CHECK(groups[0].uses[0]->kind == UseKind::conv);
    CHECK(shape_of(groups[0].uses[0]->input->value) == Shape{2, 28, 28, 1});
  } else {
    CHECK(groups[0].uses[0]->kind == UseKind::matmul);
    CHECK(shape_of(groups[0].uses[0]->input->value) == Shape{2, 14, 14, 64});
  }
  CHECK(groups[2].uses[0]->kind == UseKind::matmul);
  CHECK(groups[2].param->name == "conv2.weight");
  CHECK(shape_of(groups[2].uses[0]->input->value) == Shape{2, 5, 5, 256});
  for (const auto& p : m->parameters()) CHECK(xt::sum(xt::abs(p.grad()))() > 0.0);
}

TEST_CASE("bilstm598k, bigru: padding and unused positions do not change the logits") {
  FastRng rng(64);
  for (const char* name : {"bilstm598k", "bigru"}) {
    CAPTURE(name);
    auto m = make_model<double>(name, rng);
    NoRecordScope<double> none;
    BatchT<double> a = token_batch<double>({5, 2, 4}, 5, rng);
    ArrayT<double> ya = m->forward(a).value();
    // the same sequences padded further
    BatchT<double> b = a;
    b.tokens = xt::zeros<std::int32_t>({3, 9});
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t t = 0; t < 5; ++t) b.tokens(i, t) = a.tokens(i, t);
    DPGRAD_CHECK_CLOSE(m->forward(b).value(), ya, 1e-12);
    // each example alone gives the same logits as in the batch
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      ArrayT<double> yi = m->forward(a.select({i})).value();
      DPGRAD_CHECK_CLOSE(yi, ArrayT<double>(xt::view(ya, xt::range(i, i + 1))), 1e-12);
    }
  }
}
