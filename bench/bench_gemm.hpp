// The matrix products of one non-private training step of each benchmark
// model, counted analytically from its layer shapes, and loops over the same
// shapes: what the step's GEMMs could reach on this machine.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dpgrad::bench {

/// C (m, n) = op(A) (m, k) op(B) (k, n), `count` times per step.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  std::size_t m = 0, n = 0, k = 0;
  std::size_t count = 1;
  std::string what;  // "conv1 fwd", "lstm recurrent dW", ...
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(count); }
};

/// The GEMMs of one non-private step (forward, then backward dX and dW) of `model`
/// ("mlp" 784-256-10, "cnn26k", "cnn17m", "bilstm598k" with sequences of `length`)
/// at `batch` examples. Per linear use with x (M, d), W (d, p): forward x W,
/// dW = x^T dy, and dx = dy W^T unless x is the data (first layer of the image
/// models). Embedding gathers, im2col, pooling, activations and the loss are
/// not matrix products and are not counted.
std::vector<GemmShape> step_gemms(const std::string& model, std::size_t batch, std::size_t length = 150);

double total_flops(const std::vector<GemmShape>& gemms);

/// One pass over `gemms` on buffers allocated once, through the engine's
/// blas::gemm or (openblas_threads) as plain cblas_sgemm calls.
class GemmLoop {
 public:
  GemmLoop(std::vector<GemmShape> gemms, bool openblas_threads = false);
  /// Seconds of one pass.
  double pass();

 private:
  std::vector<GemmShape> gemms_;
  bool openblas_threads_;
  std::vector<float> a_, b_, c_;
};

/// Seconds per pass over `gemms` on preallocated buffers (median over passes,
/// at least `min_seconds` of passes in all): through the engine's blas::gemm
/// (split over the engine's threads), or with `openblas_threads` as one plain
/// cblas_sgemm call each with OpenBLAS running as many threads itself.
double time_gemms(const std::vector<GemmShape>& gemms, double min_seconds = 0.5, bool openblas_threads = false);

}  // namespace dpgrad::bench
