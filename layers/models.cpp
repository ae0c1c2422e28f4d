// Benchmark model factories: Sequential stacks for the image models, and the
// text classifiers (Embedding -> BiLSTM -> Dense -> Dense, Embedding -> BiGRU
// -> Dense) as ModelTs over token batches.
#include "layers/models.hpp"

#include "layers/attention.hpp"
#include "layers/norm.hpp"
#include "layers/registry.hpp"
#include "layers/scattering.hpp"

#include <algorithm>
#include <stdexcept>

#include "engine/ops.hpp"
#include "engine/tape.hpp"
#include "layers/conv.hpp"
#include "layers/embedding.hpp"
#include "layers/gru.hpp"
#include "layers/lstm.hpp"

namespace dpgrad {

template <class T>
std::unique_ptr<ModelT<T>> make_mlp(std::vector<std::size_t> sizes, Activation act, Rng& rng) {
  if (sizes.size() < 2) throw std::invalid_argument("make_mlp: needs at least an input and an output size");
  SequentialT<T> net;
  net.template emplace<FlattenT<T>>();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    net.template emplace<DenseT<T>>(sizes[i], sizes[i + 1], rng, "dense" + std::to_string(i + 1));
    if (i + 2 < sizes.size()) net.template emplace<ActivationT<T>>(act);
  }
  return std::make_unique<FeatureModelT<T>>(sizes.size() == 2 ? "logreg" : "mlp", std::move(net));
}

namespace {
/// (B, 1, 28, 28) -> (B, 512): the convolutional trunk shared by cnn26k and cnn17m.
template <class T>
void add_cnn_trunk(SequentialT<T>& net, Activation act, Rng& rng) {
  net.template emplace<ReshapeT<T>>(Shape{28, 28, 1});
  net.template emplace<Conv2dT<T>>(1, 16, 8, 8, 2, Padding::same(), rng, "conv1");    // (B, 14, 14, 16)
  net.template emplace<ActivationT<T>>(act);
  net.template emplace<MaxPool2dT<T>>(2, 1);                                          // (B, 13, 13, 16)
  net.template emplace<Conv2dT<T>>(16, 32, 4, 4, 2, Padding::valid(), rng, "conv2");  // (B, 5, 5, 32)
  net.template emplace<ActivationT<T>>(act);
  net.template emplace<MaxPool2dT<T>>(2, 1);                                          // (B, 4, 4, 32)
  net.template emplace<FlattenT<T>>();                                                // (B, 512)
}
}  // namespace

namespace {
/// The cnn trunk, Dense(512 -> width) act, Dense(width -> 10).
template <class T>
std::unique_ptr<ModelT<T>> make_cnn(const std::string& name, std::size_t width, Activation act, Rng& rng) {
  SequentialT<T> net;
  add_cnn_trunk(net, act, rng);
  net.template emplace<DenseT<T>>(512, width, rng, "dense1");
  net.template emplace<ActivationT<T>>(act);
  net.template emplace<DenseT<T>>(width, 10, rng, "dense2");
  return std::make_unique<FeatureModelT<T>>(name, std::move(net));
}
}  // namespace

template <class T>
std::unique_ptr<ModelT<T>> make_cnn26k(Activation act, Rng& rng) {
  return make_cnn<T>("cnn26k", 32, act, rng);
}

template <class T>
std::unique_ptr<ModelT<T>> make_cnn17m(Activation act, Rng& rng) {
  return make_cnn<T>("cnn17m", 32768, act, rng);
}

namespace {
/// batch.lengths, or every sequence at full length for an unpadded batch;
/// throws (naming `model`) unless batch.tokens is (B, L) with B lengths.
template <class T>
std::vector<std::int32_t> token_lengths(const BatchT<T>& batch, const std::string& model) {
  const auto& ids = batch.tokens;
  if (ids.dimension() != 2)
    throw std::invalid_argument(model + ": batch.tokens must be (B, L), got " + std::to_string(ids.dimension()) +
                                " axes");
  std::vector<std::int32_t> lengths = batch.lengths;
  if (lengths.empty()) lengths.assign(ids.shape()[0], std::int32_t(ids.shape()[1]));  // unpadded batch
  if (lengths.size() != ids.shape()[0])
    throw std::invalid_argument(model + ": " + std::to_string(lengths.size()) + " lengths for " +
                                std::to_string(ids.shape()[0]) + " sequences");
  return lengths;
}

/// Embedding -> BiLSTM final states -> Dense ReLU -> Dense, over batch.tokens (B, L).
template <class T>
class BiLstmClassifierT final : public ModelT<T> {
 public:
  BiLstmClassifierT(std::size_t vocab, std::size_t embed, std::size_t hidden, std::size_t dense, std::size_t classes,
                    Rng& rng)
      : embedding_(vocab, embed, rng, "embedding", 0),
        lstm_(embed, hidden, rng, "bilstm"),
        dense1_(2 * hidden, dense, rng, "dense1"),
        dense2_(dense, classes, rng, "dense2") {}

  TensorT<T> forward(const BatchT<T>& batch) override {
    const std::vector<std::int32_t> lengths = token_lengths(batch, name());
    TensorT<T> x = embedding_.forward(batch.tokens);    // (B, L, 64)
    TensorT<T> h = lstm_.forward(x, lengths, false).final;  // (B, 128); per-step states not kept
    return dense2_.forward(relu(dense1_.forward(h)));  // (B, 2)
  }
  std::vector<TensorT<T>> parameters() const override {
    std::vector<TensorT<T>> ps = embedding_.parameters();
    for (const auto* m : std::initializer_list<const ModuleT<T>*>{&lstm_, &dense1_, &dense2_})
      for (auto& p : m->parameters()) ps.push_back(p);
    return ps;
  }
  void set_training(bool on) override {
    this->training_ = on;
    embedding_.set_training(on);
    lstm_.set_training(on);
    dense1_.set_training(on);
    dense2_.set_training(on);
  }
  std::string name() const override { return "bilstm598k"; }

 private:
  EmbeddingT<T> embedding_;
  BiLstmT<T> lstm_;
  DenseT<T> dense1_, dense2_;
};
}  // namespace

template <class T>
std::unique_ptr<ModelT<T>> make_bilstm(Rng& rng, std::size_t vocab, std::size_t embed, std::size_t hidden,
                                       std::size_t dense, std::size_t classes) {
  if (classes < 2 || vocab < 2 || embed < 1 || hidden < 1 || dense < 1)
    throw std::invalid_argument("make_bilstm: sizes must be >= 1 and classes >= 2");
  return std::make_unique<BiLstmClassifierT<T>>(vocab, embed, hidden, dense, classes, rng);
}

template <class T>
std::unique_ptr<ModelT<T>> make_bilstm598k(Rng& rng, std::size_t classes) {
  if (classes < 2) throw std::invalid_argument("make_bilstm598k: classes must be >= 2, got " + std::to_string(classes));
  return std::make_unique<BiLstmClassifierT<T>>(8185, 64, 64, 64, classes, rng);
}

namespace {
/// Embedding -> BiGRU final states -> Dense, over batch.tokens (B, L).
template <class T>
class BiGruClassifierT final : public ModelT<T> {
 public:
  BiGruClassifierT(std::size_t vocab, std::size_t embed, std::size_t hidden, std::size_t classes, Rng& rng)
      : embedding_(vocab, embed, rng, "embedding", 0),
        gru_(embed, hidden, rng, "bigru"),
        dense_(2 * hidden, classes, rng, "dense") {}

  TensorT<T> forward(const BatchT<T>& batch) override {
    const std::vector<std::int32_t> lengths = token_lengths(batch, name());
    TensorT<T> x = embedding_.forward(batch.tokens);  // (B, L, embed)
    TensorT<T> h = gru_.forward(x, lengths, false).final;  // (B, 2 hidden); per-step states not kept
    return dense_.forward(h);                         // (B, classes)
  }
  std::vector<TensorT<T>> parameters() const override {
    std::vector<TensorT<T>> ps = embedding_.parameters();
    for (const auto* m : std::initializer_list<const ModuleT<T>*>{&gru_, &dense_})
      for (auto& p : m->parameters()) ps.push_back(p);
    return ps;
  }
  void set_training(bool on) override {
    this->training_ = on;
    embedding_.set_training(on);
    gru_.set_training(on);
    dense_.set_training(on);
  }
  std::string name() const override { return "bigru"; }

 private:
  EmbeddingT<T> embedding_;
  BiGruT<T> gru_;
  DenseT<T> dense_;
};
}  // namespace

namespace {
/// Embedding + positions -> pre-LN blocks -> LayerNorm -> mean over each
/// sequence's own positions -> Dense, over batch.tokens (B, L).
template <class T>
class TransformerClassifierT final : public ModelT<T> {
 public:
  TransformerClassifierT(const TransformerOptions& o, Rng& rng)
      : length_(o.length),
        embedding_(o.vocab, o.dim, rng, "embedding", 0),
        positions_(o.length, o.dim, rng, "positions"),
        norm_(o.dim, "final_norm"),
        dense_(o.dim, o.classes, rng, "dense") {
    for (std::size_t i = 0; i < o.blocks; ++i)
      blocks_.emplace_back(o.dim, o.heads, o.hidden, rng, "block" + std::to_string(i + 1));
    if (!o.train_embedding) embedding_.freeze();
  }
  TensorT<T> forward(const BatchT<T>& batch) override {
    const std::vector<std::int32_t> lengths = token_lengths(batch, name());
    const std::size_t b = lengths.size(), len = batch.tokens.shape()[1];
    const ArrayT<T> mask = key_padding_mask<T>(lengths, len);
    TensorT<T> h = positions_.forward(embedding_.forward(batch.tokens));  // (B, L, d)
    for (auto& block : blocks_) h = block.forward(h, mask);
    h = norm_.forward(h);
    // the mean over each sequence's real positions: weights 1 / length there, 0 on padding
    ArrayT<T> weights = xt::zeros<T>({b, len, std::size_t(1)});
    for (std::size_t i = 0; i < b; ++i)
      for (std::int32_t t = 0; t < lengths[i]; ++t) weights(i, std::size_t(t), 0) = T(1) / T(lengths[i]);
    return dense_.forward(sum(mul(h, constant(std::move(weights))), {1}));  // (B, classes)
  }
  std::vector<TensorT<T>> parameters() const override {
    std::vector<TensorT<T>> ps = embedding_.parameters();
    for (auto& p : positions_.parameters()) ps.push_back(p);
    for (const auto& block : blocks_)
      for (auto& p : block.parameters()) ps.push_back(p);
    for (auto& p : norm_.parameters()) ps.push_back(p);
    for (auto& p : dense_.parameters()) ps.push_back(p);
    return ps;
  }
  std::string name() const override { return "transformer"; }

 private:
  std::size_t length_;
  EmbeddingT<T> embedding_;
  PositionalEmbeddingT<T> positions_;
  std::vector<TransformerBlockT<T>> blocks_;
  LayerNormT<T> norm_;
  DenseT<T> dense_;
};
}  // namespace

template <class T>
std::unique_ptr<ModelT<T>> make_transformer(Rng& rng, const TransformerOptions& options) {
  if (options.blocks == 0) throw std::invalid_argument("transformer: needs at least one block");
  return std::make_unique<TransformerClassifierT<T>>(options, rng);
}

template <class T>
std::unique_ptr<ModelT<T>> make_bigru(Rng& rng, std::size_t vocab, std::size_t embed, std::size_t hidden,
                                      std::size_t classes) {
  return std::make_unique<BiGruClassifierT<T>>(vocab, embed, hidden, classes, rng);
}

namespace {
/// The scatter heads' first layers: GroupNorm(81, 27), then the centre if there is one.
template <class T>
SequentialT<T> scatter_normalisation(const ArrayT<T>* centre) {
  SequentialT<T> net;
  net.template emplace<GroupNormT<T>>(81, 27, "gn");
  if (centre) {
    if (shape_of(*centre) != Shape{7, 7, 81})
      throw std::invalid_argument("scatter models: the centre must be (7, 7, 81), got " + shape_str(shape_of(*centre)));
    net.template emplace<CentreT<T>>(*centre);
  }
  return net;
}
}  // namespace

template <class T>
std::unique_ptr<ModelT<T>> make_scatter_linear(Rng& rng, std::size_t classes, const ArrayT<T>* centre) {
  SequentialT<T> net = scatter_normalisation(centre);
  net.template emplace<FlattenT<T>>();
  net.template emplace<DenseT<T>>(7 * 7 * 81, classes, rng, "dense");
  return std::make_unique<FeatureModelT<T>>("scatter-linear", std::move(net));
}

template <class T>
std::unique_ptr<ModelT<T>> make_scatter_cnn(Activation act, Rng& rng, std::size_t classes, const ArrayT<T>* centre) {
  SequentialT<T> net = scatter_normalisation(centre);
  net.template emplace<Conv2dT<T>>(81, 32, 3, 3, 1, Padding::same(), rng, "conv");  // (B, 7, 7, 32)
  net.template emplace<ActivationT<T>>(act);
  net.template emplace<MaxPool2dT<T>>(2, 2);                                         // (B, 3, 3, 32)
  net.template emplace<FlattenT<T>>();
  net.template emplace<DenseT<T>>(3 * 3 * 32, classes, rng, "dense");
  return std::make_unique<FeatureModelT<T>>("scatter-cnn", std::move(net));
}

template <class T>
ArrayT<T> scattering_inputs(const ArrayT<T>& images, const std::function<void(std::size_t, std::size_t)>& progress) {
  const Shape s = shape_of(images);
  if (s.size() < 3 || (s.size() == 4 && s[1] != 1) || s.size() > 4)
    throw std::invalid_argument("scattering: images of shape " + shape_str(s) +
                                " are not (B, 1, H, W) or (B, H, W) with one channel");
  const std::size_t b = s[0], h = s[s.size() - 2], w = s[s.size() - 1];
  ArrayT<T> x = images;
  x.reshape({b, h, w, std::size_t(1)});
  return ScatteringT<T>(1, 2, 8).transform(x, 128, progress);
}

template <class T>
ArrayT<T> scattering_normalised(const ArrayT<T>& features) {
  const Shape s = shape_of(features);
  if (s.size() != 4 || s[1] != 7 || s[2] != 7 || s[3] != 81)
    throw std::invalid_argument("scattering_normalised: features of shape " + shape_str(s) + " are not (B, 7, 7, 81)");
  GroupNormT<T> gn(81, 27, "gn");
  NoRecordScope<T> none;
  ArrayT<T> out = ArrayT<T>::from_shape(s);
  const std::size_t per = 7 * 7 * 81, chunk = 4096;
  for (std::size_t first = 0; first < s[0]; first += chunk) {
    const std::size_t n = std::min(chunk, s[0] - first);
    ArrayT<T> part = ArrayT<T>::from_shape({n, 7, 7, 81});
    std::copy_n(features.data() + first * per, n * per, part.data());
    const ArrayT<T> y = gn.forward(TensorT<T>(std::move(part))).value();
    std::copy_n(y.data(), n * per, out.data() + first * per);
  }
  return out;
}

template <class T>
std::unique_ptr<ModelT<T>> build_model(const std::string& name, const ModelSpec& spec, Rng& rng) {
  const ModelEntry& m = find_model(name);
  if (!m.takes_vocabulary && spec.vocabulary != 8185)
    throw std::invalid_argument("vocabulary " + std::to_string(spec.vocabulary) + ": " + name +
                                (m.input == ModelInput::tokens ? " has an embedding of 8185 rows"
                                                               : " reads no tokens") +
                                "; only the transformer takes another size");
  if (!m.takes_frozen_embedding && !spec.train_embedding)
    throw std::invalid_argument("a frozen embedding applies to the transformer, not " + name);
  if (!m.takes_centre && spec.centred)
    throw std::invalid_argument("a feature centre applies to the scatter models, not " + name);
  if (spec.classes < 1) throw std::invalid_argument("a model needs at least one class");
  const ArrayT<T> zero = xt::zeros<T>({std::size_t(7), std::size_t(7), std::size_t(81)});
  const ArrayT<T>* centre = spec.centred ? &zero : nullptr;
  const std::string n = name;
  if (n == "mlp") return make_mlp<T>({spec.features, spec.hidden, spec.classes}, spec.activation, rng);
  if (n == "logreg") return make_mlp<T>({spec.features, spec.classes}, spec.activation, rng);
  if (n == "cnn26k") return make_cnn26k<T>(spec.activation, rng);
  if (n == "cnn17m") return make_cnn17m<T>(spec.activation, rng);
  if (n == "bilstm598k") return make_bilstm598k<T>(rng, spec.classes);
  if (n == "bigru") return make_bigru<T>(rng, 8185, 64, 64, spec.classes);
  if (n == "transformer") {
    TransformerOptions o;
    o.length = spec.length;
    o.vocab = spec.vocabulary;
    o.classes = spec.classes;
    o.train_embedding = spec.train_embedding;
    return make_transformer<T>(rng, o);
  }
  if (n == "scatter-linear") return make_scatter_linear<T>(rng, spec.classes, centre);
  if (n == "scatter-cnn") return make_scatter_cnn<T>(spec.activation, rng, spec.classes, centre);
  throw std::logic_error("build_model: the registry's model '" + n + "' has no factory");
}

template <class T>
std::unique_ptr<ModelT<T>> make_model(const std::string& name, Rng& rng, Activation act,
                                      std::vector<std::size_t> mlp_sizes) {
  ModelSpec spec;
  spec.activation = act;
  if (name == "mlp" && mlp_sizes.size() == 3) {
    spec.features = mlp_sizes[0];
    spec.hidden = mlp_sizes[1];
    spec.classes = mlp_sizes[2];
  } else if (name == "mlp") {
    return make_mlp<T>(std::move(mlp_sizes), act, rng);
  }
  if (name == "bilstm598k" || name == "bigru" || name == "transformer") spec.classes = 2;
  return build_model<T>(name, spec, rng);
}

#define DPGRAD_INSTANTIATE(T)                                                                          \
  template std::unique_ptr<ModelT<T>> make_mlp(std::vector<std::size_t>, Activation, Rng&);           \
  template std::unique_ptr<ModelT<T>> make_cnn26k(Activation, Rng&);                                  \
  template std::unique_ptr<ModelT<T>> make_cnn17m(Activation, Rng&);                                  \
  template std::unique_ptr<ModelT<T>> make_scatter_linear(Rng&, std::size_t, const ArrayT<T>*);                       \
  template std::unique_ptr<ModelT<T>> make_transformer(Rng&, const TransformerOptions&);               \
  template std::unique_ptr<ModelT<T>> make_scatter_cnn(Activation, Rng&, std::size_t, const ArrayT<T>*);\
  template ArrayT<T> scattering_normalised(const ArrayT<T>&);               \
  template std::unique_ptr<ModelT<T>> build_model(const std::string&, const ModelSpec&, Rng&);        \
  template ArrayT<T> scattering_inputs(const ArrayT<T>&, const std::function<void(std::size_t, std::size_t)>&); \
  template std::unique_ptr<ModelT<T>> make_bilstm598k(Rng&, std::size_t);                             \
  template std::unique_ptr<ModelT<T>> make_bilstm(Rng&, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t); \
  template std::unique_ptr<ModelT<T>> make_bigru(Rng&, std::size_t, std::size_t, std::size_t, std::size_t);  \
  template std::unique_ptr<ModelT<T>> make_model(const std::string&, Rng&, Activation, std::vector<std::size_t>);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
