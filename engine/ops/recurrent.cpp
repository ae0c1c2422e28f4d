// Fused LSTM step ops: lstm_gates (the four gate nonlinearities of x_t + h W_hh
// in one pass, reading x_t in place from the sequence's input projection),
// lstm_state (c' = i g + f c) and lstm_output (h = o tanh c'), each with primal,
// vjp and jvp. A step built from add, slice, sigmoid, tanh and mul runs about a
// dozen ops on (B, H) arrays; these three do the same arithmetic in three passes.
#include <vector>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/simd.hpp"
#include "engine/parallel.hpp"

namespace dpgrad {

namespace {

// Rows per parallel piece: at least this many values each.
constexpr std::size_t kGrain = 1 << 15;

/// Calls f(r0, r1) over row ranges of `rows` rows of `width` values, in parallel pieces.
template <class F>
void for_rows(std::size_t rows, std::size_t width, F&& f) {
  parallel::for_range(rows, std::max<std::size_t>(1, kGrain / std::max<std::size_t>(1, width)), f);
}

/// (B, 4H) -> H, or throws naming the op.
std::size_t gate_width(const Shape& s, const char* op) {
  if (s.size() != 2 || s[1] == 0 || s[1] % 4 != 0)
    throw std::invalid_argument(std::string(op) + ": gates " + shape_str(s) + " must be (B, 4H) with H > 0");
  return s[1] / 4;
}

void check_state(const Shape& gates, const Shape& c, const char* op) {
  if (c != Shape{gates[0], gates[1] / 4})
    throw std::invalid_argument(std::string(op) + ": state " + shape_str(c) + " must be (B, H) = " +
                                shape_str({gates[0], gates[1] / 4}) + " for gates " + shape_str(gates));
}

/// An input's gradient buffer for an op that adds to only part of it (its
/// gates' columns, or its step's block); when new, it is zeroed first.
template <class T>
T* gate_grad(GradSlot<T>& slot) {
  bool fresh;
  ArrayT<T>& g = slot.buffer(fresh);
  if (fresh) std::fill(g.begin(), g.end(), T(0));
  return g.data();
}

/// A state's gradient (B, H) += row(r, g, add) over each row r (g: the row's H values;
/// add: false when the buffer is new, so the row is assigned).
template <class T, class F>
void add_to_state(GradSlot<T>& slot, std::size_t B, std::size_t H, F&& row) {
  bool fresh;
  T* pg = slot.buffer(fresh).data();
  for_rows(B, H, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r) row(r, pg + r * H, !fresh);
  });
}

}  // namespace

/// Which steps' blocks of one gradient buffer have been written since it was made.
class StepBlocks {
 public:
  explicit StepBlocks(std::size_t steps) : written_(steps, 0) {}
  /// Whether step t's block of `buffer` must be assigned (true) rather than
  /// added to. `fresh`: the buffer was just made (garbage). A buffer these
  /// readers did not see made was made by another reader: add everywhere.
  bool claim(const void* buffer, bool fresh, std::size_t t) {
    if (t >= written_.size())
      throw std::invalid_argument("lstm_gates_at: step " + std::to_string(t) + " outside the " +
                                  std::to_string(written_.size()) + " steps of its sole readers");
    if (fresh || buffer != buffer_) std::fill(written_.begin(), written_.end(), fresh ? 0 : 1);
    buffer_ = buffer;
    const bool assign = !written_[t];
    written_[t] = 1;
    return assign;
  }

 private:
  const void* buffer_ = nullptr;
  std::vector<unsigned char> written_;
};

std::shared_ptr<StepBlocks> sole_step_readers(std::size_t steps) { return std::make_shared<StepBlocks>(steps); }

namespace {

/// a = act(x_t + zh): x is (B, 4H), or (B, L, 4H) read at step t (a whole
/// sequence's input projection, so no per-step slice is copied); zh (B, 4H)
/// is optional.
template <class T>
struct GatesOp final : Op<T> {
  bool stepped = false;  // x is (B, L, 4H)
  std::size_t t = 0, steps = 1;
  std::shared_ptr<StepBlocks> blocks;  // stepped: shared with the other steps' readers, or null
  const char* name() const override { return "lstm_gates"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_rowwise(in, shapes);
  }

  /// Offset of row r of x_t in x.
  std::size_t x_row(std::size_t r, std::size_t W) const { return (r * steps + t) * W; }

  ArrayT<T> forward(Values<T> x) override {
    const Shape xs = shape_of(*x[0]);
    Shape zs = xs;
    if (stepped) {
      if (xs.size() != 3 || t >= xs[1])
        throw std::invalid_argument(std::string(name()) + ": step " + std::to_string(t) + " of input " +
                                    shape_str(xs) + ", which must be (B, L, 4H) with the step < L");
      steps = xs[1];
      zs = Shape{xs[0], xs[2]};
    }
    const std::size_t H = gate_width(zs, name()), W = 4 * H;
    const bool has_h = x.size() > 1;
    if (has_h && shape_of(*x[1]) != zs)
      throw std::invalid_argument(std::string(name()) + ": recurrent term " + shape_str(shape_of(*x[1])) +
                                  " must match the gates " + shape_str(zs));
    ArrayT<T> a = ArrayT<T>::from_shape(zs);
    const T* px = x[0]->data();
    const T* ph = has_h ? x[1]->data() : nullptr;
    T* pa = a.data();
    for_rows(zs[0], W, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        const T* xr = px + x_row(r, W);
        const T* hr = has_h ? ph + r * W : nullptr;
        T* ar = pa + r * W;
        simd::sigmoid(xr, hr, ar, 2 * H);  // i, f
        simd::tanh(xr + 2 * H, hr ? hr + 2 * H : nullptr, ar + 2 * H, H);  // g
        simd::sigmoid(xr + 3 * H, hr ? hr + 3 * H : nullptr, ar + 3 * H, H);  // o
      }
    });
    return a;
  }
  /// f'(z) from the output a: 1 - a^2 on the tanh gate, a (1 - a) on the sigmoid ones.
  template <bool Tanh>
  static T slope(T a) {
    return Tanh ? T(1) - a * a : a * (T(1) - a);
  }
  /// d[0, 4H) = f'(z) of one row from its output a (branch-free runs that vectorise).
  static void slopes(const T* __restrict a, T* __restrict d, std::size_t H) {
    for (std::size_t j = 0; j < 2 * H; ++j) d[j] = slope<false>(a[j]);
    for (std::size_t j = 2 * H; j < 3 * H; ++j) d[j] = slope<true>(a[j]);
    for (std::size_t j = 3 * H; j < 4 * H; ++j) d[j] = slope<false>(a[j]);
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    const bool has_h = x.size() > 1;
    if (!dx[0] && !(has_h && dx[1])) return;
    const std::size_t W = out.shape()[1], H = W / 4;
    T* gx = nullptr;
    bool fresh_x = false;
    if (dx[0]) {
      if (stepped && blocks) {  // this step's block only, assigned if no reader has written it yet
        bool made;
        gx = dx[0].buffer(made).data();
        fresh_x = blocks->claim(gx, made, t);
      } else if (stepped) {
        gx = gate_grad(dx[0]);  // this step's block only: the rest starts at zero
      } else {
        gx = dx[0].buffer(fresh_x).data();
      }
    }
    T* gh = nullptr;
    bool fresh_h = false;
    if (has_h && dx[1]) gh = dx[1].buffer(fresh_h).data();
    const T* pd = dout.data();
    const T* pa = out.data();
    // dz = f'(z) dout in one pass per row, straight into the inputs' gradients
    // (assigned where fresh, else added)
    for_rows(out.shape()[0], W, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r)
        simd::lstm_gates_vjp(pa + r * W, pd + r * W, gx ? gx + (stepped ? x_row(r, W) : r * W) : nullptr,
                             gh ? gh + r * W : nullptr, H, !fresh_x, !fresh_h);
    });
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t W = out.shape()[1], H = W / 4, n = out.size(), nx = x[0]->size();
    const bool has_h = x.size() > 1;
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    T* pr = r.data();
    const T* tx = dot[0] ? dot[0]->data() : nullptr;
    const T* th = has_h && dot[1] ? dot[1]->data() : nullptr;
    const T* pa = out.data();
    for_rows(out.shape()[0], W * k, [&](std::size_t r0, std::size_t r1) {
      std::vector<T> d(W);
      for (std::size_t row = r0; row < r1; ++row) {
        slopes(pa + row * W, d.data(), H);
        for (std::size_t j = 0; j < k; ++j) {
          T* __restrict rr = pr + j * n + row * W;
          if (tx) {
            const T* __restrict xr = tx + j * nx + x_row(row, W);
            for (std::size_t l = 0; l < W; ++l) rr[l] = d[l] * xr[l];
          } else {
            std::fill_n(rr, W, T(0));
          }
          if (th) {
            const T* __restrict hr = th + j * n + row * W;
            for (std::size_t l = 0; l < W; ++l) rr[l] += d[l] * hr[l];
          }
        }
      }
    });
    return r;
  }
};

/// c' = a_i a_g + a_f c (inputs: a, and c unless the previous state is zero).
template <class T>
struct StateOp final : Op<T> {
  const char* name() const override { return "lstm_state"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_rowwise(in, shapes);
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    const std::size_t H = gate_width(shape_of(a), name()), W = 4 * H, B = a.shape()[0];
    const bool has_c = x.size() > 1;
    if (has_c) check_state(shape_of(a), shape_of(*x[1]), name());
    ArrayT<T> c = ArrayT<T>::from_shape({B, H});
    const T* pa = a.data();
    const T* pc = has_c ? x[1]->data() : nullptr;
    T* po = c.data();
    for_rows(B, W, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        const T* ar = pa + r * W;
        T* cr = po + r * H;
        simd::scaled_into(ar, ar + 2 * H, T(1), cr, H, false);             // a_i a_g
        if (has_c) simd::scaled_into(ar + H, pc + r * H, T(1), cr, H, true);  // + a_f c
      }
    });
    return c;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    const std::size_t B = out.shape()[0], H = out.shape()[1], W = 4 * H;
    const bool has_c = x.size() > 1;
    const T* pa = x[0]->data();
    const T* pc = has_c ? x[1]->data() : nullptr;
    const T* pd = dout.data();
    if (dx[0]) {
      T* pg = gate_grad(dx[0]);
      for_rows(B, W, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
          const T* ar = pa + r * W;
          const T* dr = pd + r * H;
          T* gr = pg + r * W;
          simd::scaled_into(dr, ar + 2 * H, T(1), gr, H, true);                    // d/da_i = a_g
          simd::scaled_into(dr, ar, T(1), gr + 2 * H, H, true);                    // d/da_g = a_i
          if (has_c) simd::scaled_into(dr, pc + r * H, T(1), gr + H, H, true);  // d/da_f = c
        }
      });
    }
    if (has_c && dx[1])  // d/dc = a_f
      add_to_state(dx[1], B, H, [&](std::size_t r, T* g, bool add) { simd::scaled_into(pd + r * H, pa + r * W + H, T(1), g, H, add); });
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t B = out.shape()[0], H = out.shape()[1], W = 4 * H, n = out.size(), na = B * W;
    const bool has_c = x.size() > 1;
    const T* pa = x[0]->data();
    const T* pc = has_c ? x[1]->data() : nullptr;
    const T* ta = dot[0] ? dot[0]->data() : nullptr;
    const T* tc = has_c && dot[1] ? dot[1]->data() : nullptr;
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    T* pr = r.data();
    for_rows(B, W * k, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t t = 0; t < k; ++t)
        for (std::size_t row = r0; row < r1; ++row) {  // branch-free runs per case, so that they vectorise
          const T* __restrict ar = pa + row * W;
          T* __restrict rr = pr + t * n + row * H;
          if (ta) {
            const T* __restrict dr = ta + t * na + row * W;
            for (std::size_t j = 0; j < H; ++j) rr[j] = dr[j] * ar[2 * H + j] + ar[j] * dr[2 * H + j];
            if (has_c)
              for (std::size_t j = 0; j < H; ++j) rr[j] += dr[H + j] * pc[row * H + j];
          } else {
            std::fill_n(rr, H, T(0));
          }
          if (tc) {
            const T* __restrict cr = tc + t * n + row * H;
            for (std::size_t j = 0; j < H; ++j) rr[j] += ar[H + j] * cr[j];
          }
        }
    });
    return r;
  }
};

/// h = a_o tanh(c); keeps tanh(c) for its rules.
template <class T>
struct OutputOp final : Op<T> {
  ArrayT<T> tc;  // tanh(c)
  const char* name() const override { return "lstm_output"; }
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_rowwise(in, shapes);
  }

  ArrayT<T> forward(Values<T> x) override {
    const ArrayT<T>& a = *x[0];
    const std::size_t H = gate_width(shape_of(a), name()), W = 4 * H, B = a.shape()[0];
    check_state(shape_of(a), shape_of(*x[1]), name());
    tc = ArrayT<T>::from_shape({B, H});
    ArrayT<T> h = ArrayT<T>::from_shape({B, H});
    const T* pa = a.data();
    const T* pc = x[1]->data();
    T* pt = tc.data();
    T* ph = h.data();
    for_rows(B, W, [&](std::size_t r0, std::size_t r1) {
      simd::tanh(pc + r0 * H, static_cast<const T*>(nullptr), pt + r0 * H, (r1 - r0) * H);
      for (std::size_t r = r0; r < r1; ++r) simd::scaled_into(pa + r * W + 3 * H, pt + r * H, T(1), ph + r * H, H, false);
    });
    return h;
  }
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    const std::size_t B = out.shape()[0], H = out.shape()[1], W = 4 * H;
    const T* pa = x[0]->data();
    const T* pd = dout.data();
    const T* pt = tc.data();
    if (dx[0]) {
      T* pg = gate_grad(dx[0]);
      for_rows(B, W, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r)  // d/da_o = tanh c
          simd::scaled_into(pd + r * H, pt + r * H, T(1), pg + r * W + 3 * H, H, true);
      });
    }
    if (dx[1])  // d/dc = a_o (1 - tanh^2 c)
      add_to_state(dx[1], B, H, [&](std::size_t r, T* g, bool add) {
        simd::tanh_slope_into(pd + r * H, pa + r * W + 3 * H, pt + r * H, g, H, add);
      });
  }
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t k) override {
    const std::size_t B = out.shape()[0], H = out.shape()[1], W = 4 * H, n = out.size(), na = B * W;
    const T* pa = x[0]->data();
    const T* pt = tc.data();
    const T* ta = dot[0] ? dot[0]->data() : nullptr;
    const T* tcd = dot[1] ? dot[1]->data() : nullptr;
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(k, shape_of(out)));
    T* pr = r.data();
    for_rows(B, W * k, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t t = 0; t < k; ++t)
        for (std::size_t row = r0; row < r1; ++row) {  // branch-free runs per case, so that they vectorise
          const T* __restrict ao = pa + row * W + 3 * H;  // a_o
          const T* __restrict tr = pt + row * H;          // tanh c
          T* __restrict rr = pr + t * n + row * H;
          if (ta) {
            const T* __restrict dao = ta + t * na + row * W + 3 * H;
            for (std::size_t j = 0; j < H; ++j) rr[j] = dao[j] * tr[j];
          } else {
            std::fill_n(rr, H, T(0));
          }
          if (tcd) {
            const T* __restrict dc = tcd + t * n + row * H;
            for (std::size_t j = 0; j < H; ++j) rr[j] += ao[j] * (T(1) - tr[j] * tr[j]) * dc[j];
          }
        }
    });
    return r;
  }
};

}  // namespace

template <class T>
TensorT<T> lstm_gates(const TensorT<T>& z, const TensorT<T>& zh) {
  if (!zh.defined()) return apply<T>(std::make_unique<GatesOp<T>>(), {z});
  return apply<T>(std::make_unique<GatesOp<T>>(), {z, zh});
}
template <class T>
TensorT<T> lstm_gates_at(const TensorT<T>& proj, std::size_t t, const TensorT<T>& zh,
                         std::shared_ptr<StepBlocks> blocks) {
  auto op = std::make_unique<GatesOp<T>>();
  op->stepped = true;
  op->t = t;
  op->blocks = std::move(blocks);
  if (!zh.defined()) return apply<T>(std::move(op), {proj});
  return apply<T>(std::move(op), {proj, zh});
}
template <class T>
TensorT<T> lstm_state(const TensorT<T>& a, const TensorT<T>& c) {
  if (!c.defined()) return apply<T>(std::make_unique<StateOp<T>>(), {a});
  return apply<T>(std::make_unique<StateOp<T>>(), {a, c});
}
template <class T>
TensorT<T> lstm_output(const TensorT<T>& a, const TensorT<T>& c) {
  return apply<T>(std::make_unique<OutputOp<T>>(), {a, c});
}

#define DPGRAD_INSTANTIATE(T)                                               \
  template TensorT<T> lstm_gates(const TensorT<T>&, const TensorT<T>&);     \
  template TensorT<T> lstm_gates_at(const TensorT<T>&, std::size_t, const TensorT<T>&, std::shared_ptr<StepBlocks>); \
  template TensorT<T> lstm_state(const TensorT<T>&, const TensorT<T>&);     \
  template TensorT<T> lstm_output(const TensorT<T>&, const TensorT<T>&);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
