// The benchmark models of the papers dpgrad reproduces, built from layers:
// an MLP, cnn26k (26,010 parameters), cnn17m (17,146,938) on 28x28 images,
// bilstm598k (598,274) and bigru (574,018) on token sequences. Every factory
// returns a ModelT.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/dense.hpp"
#include "layers/module.hpp"

namespace dpgrad {

/// Flatten; Dense(sizes[0], sizes[1]) act; ...; Dense(sizes[n-2], sizes[n-1]) (no
/// activation on the logits). Inputs (B, ...) with prod(...) = sizes[0], e.g. (B, 1, 28, 28).
template <class T>
std::unique_ptr<ModelT<T>> make_mlp(std::vector<std::size_t> sizes, Activation act, Rng& rng);  // "logreg" for 2 sizes

/// Input (B, 1, 28, 28) -> Reshape (B, 28, 28, 1); Conv2d(16, 8x8, stride 2, same) act;
/// MaxPool(2, stride 1); Conv2d(32, 4x4, stride 2, valid) act; MaxPool(2, stride 1);
/// Flatten (512); Dense(32) act; Dense(10). 1040 + 8224 + 16416 + 330 = 26,010 parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_cnn26k(Activation act, Rng& rng);

/// cnn26k's convolutions (9,264 parameters) with one wide dense layer:
/// Flatten (512); Dense(32768) act; Dense(10). 9264 + 16,809,984 + 327,690 =
/// 17,146,938 parameters, the count of the JL paper's large CNN.
template <class T>
std::unique_ptr<ModelT<T>> make_cnn17m(Activation act, Rng& rng);

/// Tokens (B, L) padded with 0 and their lengths: Embedding(8185, 64, padding 0);
/// bidirectional LSTM(64); [forward final, backward final] (128); Dense(64) ReLU;
/// Dense(classes). With 2 classes: 523,840 + 66,048 + 8,256 + 130 = 598,274 parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_bilstm598k(Rng& rng, std::size_t classes = 2);

/// bilstm598k's architecture at any size: Embedding(vocab, embed, padding 0);
/// bidirectional LSTM(hidden); Dense(dense) ReLU; Dense(classes).
template <class T>
std::unique_ptr<ModelT<T>> make_bilstm(Rng& rng, std::size_t vocab, std::size_t embed, std::size_t hidden,
                                       std::size_t dense, std::size_t classes);

/// Tokens (B, L) padded with 0 and their lengths: Embedding(vocab, embed, padding 0);
/// bidirectional GRU(hidden); [forward final, backward final] (2 hidden); Dense(classes).
/// The defaults are "bigru", bilstm598k's embedding and hidden sizes with a GRU
/// (3 gate blocks, two biases) and one dense layer: Embedding 8185 * 64 = 523,840;
/// BiGRU 2 * (64 * 192 + 64 * 192 + 192 + 192) = 49,920; Dense 128 * 2 + 2 = 258;
/// 574,018 parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_bigru(Rng& rng, std::size_t vocab = 8185, std::size_t embed = 64,
                                      std::size_t hidden = 64, std::size_t classes = 2);

/// A transformer text classifier's sizes. The defaults are "transformer": 2
/// pre-LN blocks of d 64, 4 heads, MLP 256, over hashed tokens (8185) padded to 150.
struct TransformerOptions {
  /// The number of token ids (the embedding's rows), the padded sequence length,
  /// the width d, attention heads (dividing d), MLP hidden units, encoder blocks
  /// (at least 1) and output classes.
  std::size_t vocab = 8185, length = 150, dim = 64, heads = 4, hidden = 256, blocks = 2, classes = 2;
  /// false: the embedding table stays at its random initialisation (Embedding::freeze),
  /// so only the parameters after it (109,826 of the defaults' 633,666) train, are clipped and are noised.
  bool train_embedding = true;
};
/// Tokens (B, L) padded with 0 and their lengths: Embedding(vocab, d, padding 0)
/// plus learned positions (L, d); `blocks` pre-LN encoder blocks with the
/// padding masked out of attention; LayerNorm; the mean over each sequence's
/// positions; Dense(classes). The defaults: 523,840 + 9,600 + 2 * 49,984 +
/// 128 + 130 = 633,666 parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_transformer(Rng& rng, const TransformerOptions& options = {});

/// Heads on scattering features (layers/scattering.hpp), after Tramer and Boneh
/// (2021): the input is the scattering transform (J = 2, L = 8) of 28 x 28
/// images, (B, 7, 7, 81), computed once before training (scattering_inputs).
/// scatter-linear: GroupNorm(81 channels, 27 groups); Flatten (3969);
/// Dense(classes). With 10 classes: 162 + 39,700 = 39,862 parameters.
/// `centre` (7, 7, 81), when given, is taken from every sample after the
/// GroupNorm (CentreT; a private estimate of the mean of scattering_normalised:
/// docs/feature-centring.md). It adds no parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_scatter_linear(Rng& rng, std::size_t classes = 10, const ArrayT<T>* centre = nullptr);
/// scatter-cnn: GroupNorm(81, 27); Conv2d(32, 3x3, same) act; MaxPool(2, stride 2)
/// (3, 3, 32); Flatten (288); Dense(classes). With 10 classes: 162 + 23,360 +
/// 2,890 = 26,412 parameters.
template <class T>
std::unique_ptr<ModelT<T>> make_scatter_cnn(Activation act, Rng& rng, std::size_t classes = 10,
                                            const ArrayT<T>* centre = nullptr);

/// What the scatter models' GroupNorm makes of scattering features (B, 7, 7, 81)
/// at initialisation (gain 1, shift 0), in chunks: every sample normalised within
/// itself, so each has L2 norm at most sqrt(3969) = 63.
template <class T>
ArrayT<T> scattering_normalised(const ArrayT<T>& features);

/// True for the models that read scattering features instead of images (throws on an unknown name).
bool model_reads_scattering(const std::string& name);

/// Images (B, 1, H, W) or (B, H, W) with one channel -> their scattering
/// features (B, ceil(H/4), ceil(W/4), 81), J = 2, L = 8, in pieces;
/// `progress(done, total)` after each piece. Data-independent: no privacy cost.
template <class T>
ArrayT<T> scattering_inputs(const ArrayT<T>& images, const std::function<void(std::size_t, std::size_t)>& progress = {});

/// The names of the bundled models (layers/registry.hpp), in its order.
std::vector<std::string> model_names();

/// True for the models that read token sequences (throws on an unknown name).
bool model_reads_tokens(const std::string& name);

/// A model by name with its default sizes (build_model, layers/registry.hpp, takes
/// them all): `act` applies to mlp and the CNNs, `mlp_sizes` to mlp; the token
/// models have 2 classes, the others 10. Throws std::invalid_argument on an unknown name.
template <class T>
std::unique_ptr<ModelT<T>> make_model(const std::string& name, Rng& rng, Activation act = Activation::relu,
                                      std::vector<std::size_t> mlp_sizes = {784, 256, 10});

}  // namespace dpgrad
