// GEMM shapes of the benchmark models and the reference sgemm loop.
#include "bench/bench_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "engine/blas.hpp"
#include "engine/parallel.hpp"

namespace dpgrad::bench {

namespace {

/// x (rows, d) W (d, p): forward, dx (when x needs a gradient) and dW.
void add_linear(std::vector<GemmShape>& g, const std::string& name, std::size_t rows, std::size_t d, std::size_t p,
                bool input_grad, std::size_t count = 1) {
  g.push_back({false, false, rows, p, d, count, name + " fwd"});
  if (input_grad) g.push_back({false, true, rows, d, p, count, name + " dx"});
  g.push_back({true, false, d, p, rows, count, name + " dW"});
}

}  // namespace

std::vector<GemmShape> step_gemms(const std::string& model, std::size_t b, std::size_t length) {
  std::vector<GemmShape> g;
  if (model.rfind("onnx:", 0) == 0) return g;  // an imported model: no reference shapes
  if (model == "logreg") {
    add_linear(g, "dense", b, 784, 10, false);
  } else if (model == "bigru") {
    // per direction: one input projection over all steps (3 gates), then L-1 recurrent products
    add_linear(g, "gru input", b * length, 64, 192, true, 2);
    if (length > 1) add_linear(g, "gru recurrent", b, 64, 192, true, 2 * (length - 1));
    add_linear(g, "dense", b, 128, 2, true);
  } else if (model == "mlp") {
    add_linear(g, "dense1", b, 784, 256, false);
    add_linear(g, "dense2", b, 256, 10, true);
  } else if (model == "cnn26k" || model == "cnn17m") {
    const std::size_t wide = model == "cnn26k" ? 32 : 32768;
    add_linear(g, "conv1", b * 14 * 14, 8 * 8 * 1, 16, false);  // im2col rows (B*14*14, 64)
    add_linear(g, "conv2", b * 5 * 5, 4 * 4 * 16, 32, true);     // (B*5*5, 256)
    add_linear(g, "dense1", b, 512, wide, true);
    add_linear(g, "dense2", b, wide, 10, true);
  } else if (model == "bilstm598k") {
    // per direction: one input projection over all steps, then L-1 recurrent products
    add_linear(g, "lstm input", b * length, 64, 256, true, 2);
    if (length > 1) add_linear(g, "lstm recurrent", b, 64, 256, true, 2 * (length - 1));
    add_linear(g, "dense1", b, 128, 64, true);
    add_linear(g, "dense2", b, 64, 2, true);
  } else if (model == "transformer") {
    // per block: q, k, v, out (d x d) and the MLP (d x 4d, 4d x d) over every position;
    // the attention products (q k^T, weights x v and their four backward products) are
    // products of activations, per sample and head
    const std::size_t d = 64, heads = 4, dk = d / heads, blocks = 2;
    add_linear(g, "attention projections", b * length, d, d, true, 4 * blocks);
    add_linear(g, "mlp up", b * length, d, 4 * d, true, blocks);
    add_linear(g, "mlp down", b * length, 4 * d, d, true, blocks);
    const std::size_t pairs = b * heads * blocks;
    g.push_back({false, true, length, length, dk, pairs, "scores q k^T fwd"});
    g.push_back({false, false, length, dk, length, pairs, "weighted values fwd"});
    // backward, P the weights: dP = dO v^T, dv = P^T dO, dq = dS k, dk = dS^T q
    g.push_back({false, true, length, length, dk, pairs, "attention dP"});
    g.push_back({true, false, length, dk, length, pairs, "attention dv"});
    g.push_back({false, false, length, dk, length, pairs, "attention dq"});
    g.push_back({true, false, length, dk, length, pairs, "attention dk"});
    add_linear(g, "dense", b, d, 2, true);
  } else if (model == "scatter-linear") {
    add_linear(g, "dense", b, 7 * 7 * 81, 10, true);
  } else if (model == "scatter-cnn") {
    add_linear(g, "conv", b * 7 * 7, 3 * 3 * 81, 32, true);  // im2col rows (B*7*7, 729)
    add_linear(g, "dense", b, 288, 10, true);
  } else {
    throw std::invalid_argument("no GEMM shapes for model '" + model + "' (bench/bench_gemm.cpp lists each bundled model's)");
  }
  return g;
}

double total_flops(const std::vector<GemmShape>& gemms) {
  double f = 0;
  for (const auto& s : gemms) f += s.flops();
  return f;
}

GemmLoop::GemmLoop(std::vector<GemmShape> gemms, bool openblas_threads)
    : gemms_(std::move(gemms)), openblas_threads_(openblas_threads) {
  std::size_t a_max = 0, b_max = 0, c_max = 0;
  for (const auto& s : gemms_) {
    a_max = std::max(a_max, s.m * s.k);
    b_max = std::max(b_max, s.k * s.n);
    c_max = std::max(c_max, s.m * s.n);
  }
  a_.resize(a_max);
  b_.resize(b_max);
  c_.assign(c_max * std::size_t(parallel::threads()), 0.0f);  // small repeated products: one C per thread
  for (std::size_t i = 0; i < a_.size(); ++i) a_[i] = float(int(i % 17) - 8) * 0.01f;
  for (std::size_t i = 0; i < b_.size(); ++i) b_[i] = float(int(i % 13) - 6) * 0.01f;
}

double GemmLoop::pass() {
  struct OpenblasThreads {  // OpenBLAS's own threads for this pass, then one again (the engine's setting)
    bool on;
    explicit OpenblasThreads(bool o) : on(o) {
      if (on) openblas_set_num_threads(parallel::threads());
    }
    ~OpenblasThreads() {
      if (on) openblas_set_num_threads(1);
    }
  } threads_scope(openblas_threads_);
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : gemms_) {
    // products too small for blas::gemm to split (attention's, per sample and
    // head) run their repetitions spread over the engine's threads, as the step does
    if (!openblas_threads_ && s.count > 1 && s.m * s.n * s.k < (std::size_t(1) << 21)) {
      const std::size_t c_len = c_.size() / std::size_t(parallel::threads());
      std::atomic<std::size_t> slot{0};
      parallel::for_range(s.count, 1, [&](std::size_t r0, std::size_t r1) {
        float* c = c_.data() + slot.fetch_add(1) * c_len;
        for (std::size_t r = r0; r < r1; ++r)
          blas::gemm<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a_.data(), b_.data(), 0.0f, c);
      });
      continue;
    }
    for (std::size_t r = 0; r < s.count; ++r)
      if (openblas_threads_)
        cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                    int(s.m), int(s.n), int(s.k), 1.0f, a_.data(), s.trans_a ? int(s.m) : int(s.k), b_.data(),
                    s.trans_b ? int(s.k) : int(s.n), 0.0f, c_.data(), int(s.n));
      else
        blas::gemm<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a_.data(), b_.data(), 0.0f, c_.data());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double time_gemms(const std::vector<GemmShape>& gemms, double min_seconds, bool openblas_threads) {
  if (gemms.empty()) return 0;
  GemmLoop loop(gemms, openblas_threads);
  loop.pass();  // warm-up: OpenBLAS buffers, threads, page faults
  std::vector<double> times;
  double spent = 0;
  while (times.size() < 3 || (spent < min_seconds && times.size() < 1000)) {
    times.push_back(loop.pass());
    spent += times.back();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace dpgrad::bench
