// Fused multi-head attention (docs/fused-ops.md): scores, scale, key padding
// mask, softmax and the weighted sum of values as one op. The heads are read in
// place as column blocks of q, k, v (B, L, heads * dk), and the output is written
// in the same layout, so no transpose or reshape is copied. Each (sample, head)
// is worked in blocks of queries and keys with an online softmax; only the
// log-sum-exp of every score row is kept, and the backward and forward-mode
// rules recompute the weights block by block from it.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/ops.hpp"
#include "engine/ops/common.hpp"
#include "engine/simd.hpp"

namespace dpgrad {

namespace {

using detail::shape_str;

// Blocks of at most this many queries and keys: one (sample, head) of a
// sequence up to this long is a single block, and a block's scores (256 x 256)
// stay in the core's L2 cache however long the sequences are.
constexpr std::size_t kMaxBlock = 256;

/// n split into ceil(n / kMaxBlock) blocks of nearly equal size: their length.
inline std::size_t block_length(std::size_t n) {
  if (n == 0) return 1;
  const std::size_t blocks = (n + kMaxBlock - 1) / kMaxBlock;
  return (n + blocks - 1) / blocks;
}

/// Attention over q (B, Lq, H dk), k (B, Lk, H dk), v (B, Lk, H dv) -> (B, Lq, H dv).
template <class T>
struct AttentionOp final : Op<T> {
  std::size_t heads;
  T scale;
  ArrayT<T> mask;  // as given: B * Lk values, nonzero where a key is padding; 0-d (the default ArrayT): none
  std::size_t b = 0, lq = 0, lk = 0, dk = 0, dv = 0;
  // per sample: keys at or after kend[i] are all masked (they get weight 0 and
  // are skipped); masked[i] lists the masked keys before kend[i]; uniform[i]:
  // every key is masked, so every weight is 1 / Lk and no score has a gradient
  // (the scores are all the same constant, as a masked_fill gives them)
  std::vector<std::size_t> kend;
  std::vector<std::vector<std::size_t>> masked;
  std::vector<unsigned char> uniform;
  // (B, H, Lq): log sum_j exp(s_ij) over each score row's unmasked keys; the rules
  // recompute the weights from it block by block (docs/fused-ops.md)
  ArrayT<T> lse;

  AttentionOp(std::size_t h, T s, ArrayT<T> m) : heads(h), scale(s), mask(std::move(m)) {}
  const char* name() const override { return "attention"; }
  /// Each sample attends within itself: rows stay on axis 0 when q, k and v agree there.
  Samples samples(std::span<const Samples> in, Values<T> x, const ArrayT<T>&) const override {
    const auto shapes = detail::shapes_of(x);
    return samples_rowwise(in, std::span<const Shape>(shapes));
  }

  /// (sample, head) pairs per piece: four pieces per thread, claimed by whichever thread
  /// is free, so that a thread that starts late or runs slower does not hold the op up.
  std::size_t pair_grain() const { return parallel::grain_for(b * heads, 4); }

  std::size_t ldq() const { return heads * dk; }
  std::size_t ldv() const { return heads * dv; }
  /// At least every sample's key block: block_length(kend[i]) for any kend[i] <= Lk
  /// (block_length is not monotone: 400 keys make blocks of 200, 520 of 174).
  std::size_t key_block_bound() const { return std::max<std::size_t>(1, std::min(lk, kMaxBlock)); }

  /// Scratch for simd::gemm_small's copy of its second factor, enough for every product
  /// of a block: at most max(dk, dv, query block, key block) rows of as many columns.
  std::size_t pack_size() const {
    const std::size_t depth = std::max({dk, dv, block_length(lq), key_block_bound()});
    return depth * simd::gemm_pack_width<T>(std::max({dk, dv, key_block_bound()}));
  }

  ArrayT<T> forward(Values<T> x) override {
    const Shape sq = shape_of(*x[0]), sk = shape_of(*x[1]), sv = shape_of(*x[2]);
    const bool ok = sq.size() == 3 && sk.size() == 3 && sv.size() == 3 && sk[0] == sq[0] && sv[0] == sq[0] &&
                    sv[1] == sk[1] && sk[2] == sq[2] && heads > 0 && sq[2] % heads == 0 && sv[2] % heads == 0;
    if (!ok)
      throw std::invalid_argument("attention: q " + shape_str(sq) + ", k " + shape_str(sk) + ", v " + shape_str(sv) +
                                  " with " + std::to_string(heads) +
                                  " heads: need q (B, Lq, H dk), k (B, Lk, H dk), v (B, Lk, H dv), H dividing the widths");
    b = sq[0];
    lq = sq[1];
    lk = sk[1];
    dk = sq[2] / heads;
    dv = sv[2] / heads;
    if (lk == 0 && b * lq > 0) throw std::invalid_argument("attention: no keys to attend to (Lk = 0)");
    if (mask.dimension() > 0) {
      const Shape ms = shape_of(mask);
      if (mask.size() != b * lk || ms.empty() || ms.front() != b || ms.back() != lk)
        throw std::invalid_argument("attention: a key mask of shape " + shape_str(ms) + " for " + std::to_string(b) +
                                    " samples of " + std::to_string(lk) + " keys: need (B, Lk) or (B, 1, 1, Lk)");
    }
    scale = scale > T(0) ? scale : T(1.0 / std::sqrt(double(dk)));
    kend.assign(b, lk);
    masked.assign(b, {});
    uniform.assign(b, 0);
    for (std::size_t i = 0; i < b && mask.dimension() > 0; ++i) {
      const T* m = mask.data() + i * lk;
      std::size_t end = lk;
      while (end > 0 && m[end - 1] != T(0)) --end;
      if (end == 0) {  // every key masked
        uniform[i] = 1;
        continue;
      }
      kend[i] = end;
      for (std::size_t j = 0; j < end; ++j)
        if (m[j] != T(0)) masked[i].push_back(j);
    }
    lse = ArrayT<T>::from_shape({b, heads, lq});
    ArrayT<T> out = ArrayT<T>::from_shape({b, lq, heads * dv});
    const T *q = x[0]->data(), *k = x[1]->data(), *v = x[2]->data();
    T* o = out.data();
    const std::size_t qb = block_length(lq);
    parallel::for_each_piece(b * heads, pair_grain(), [&](std::size_t p0, std::size_t p1) {
      std::vector<T> s(qb * key_block_bound()), m(qb), l(qb), scratch(pack_size());
      T* pack = scratch.data();
      for (std::size_t pair = p0; pair < p1; ++pair) {
        const std::size_t i = pair / heads, h = pair % heads;
        for (std::size_t r0 = 0; r0 < lq; r0 += qb)
          forward_block(i, h, r0, std::min(qb, lq - r0), q, k, v, o, s.data(), m.data(), l.data(), pack);
      }
    });
    return out;
  }

  /// s (qn, kn) = the scores of queries [r0, r0 + qn) against keys [c0, c0 + kn)
  /// of sample i, head h, masked keys at -inf (uniform samples: all 0).
  void scores(std::size_t i, std::size_t h, std::size_t r0, std::size_t qn, std::size_t c0, std::size_t kn,
              const T* q, const T* k, T* s, T* pack) const {
    if (uniform[i]) {
      std::fill_n(s, qn * kn, T(0));
      return;
    }
    simd::gemm_small<T>(false, true, qn, kn, dk, scale, q + (i * lq + r0) * ldq() + h * dk, ldq(),
                          k + (i * lk + c0) * ldq() + h * dk, ldq(), T(0), s, kn, pack);
    for (std::size_t j : masked[i])
      if (j >= c0 && j < c0 + kn)
        for (std::size_t r = 0; r < qn; ++r) s[r * kn + j - c0] = -std::numeric_limits<T>::infinity();
  }

  /// Online softmax over the key blocks of one query block: o (qn rows, stride H dv) and its lse.
  void forward_block(std::size_t i, std::size_t h, std::size_t r0, std::size_t qn, const T* q, const T* k,
                     const T* v, T* o, T* s, T* m, T* l, T* pack) {
    const std::size_t kb = block_length(kend[i]);
    T* ob = o + (i * lq + r0) * ldv() + h * dv;
    std::fill_n(m, qn, -std::numeric_limits<T>::infinity());
    std::fill_n(l, qn, T(0));
    for (std::size_t c0 = 0; c0 < kend[i]; c0 += kb) {
      const std::size_t kn = std::min(kb, kend[i] - c0);
      scores(i, h, r0, qn, c0, kn, q, k, s, pack);
      for (std::size_t r = 0; r < qn; ++r) {
        T* row = s + r * kn;
        const T m_new = std::max(m[r], simd::max(row, kn));
        if (m_new == -std::numeric_limits<T>::infinity()) {  // every key so far masked: nothing yet
          std::fill_n(row, kn, T(0));
          continue;
        }
        const T alpha = m[r] == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(m[r] - m_new);
        l[r] = alpha * l[r] + simd::exp_shifted(row, kn, m_new);
        m[r] = m_new;
        if (c0 > 0 && alpha != T(1))
          for (std::size_t c = 0; c < dv; ++c) ob[r * ldv() + c] *= alpha;
      }
      simd::gemm_small<T>(false, false, qn, dv, kn, T(1), s, kn, v + (i * lk + c0) * ldv() + h * dv, ldv(),
                            c0 == 0 ? T(0) : T(1), ob, ldv(), pack);
    }
    T* lse_row = lse.data() + (i * heads + h) * lq + r0;
    for (std::size_t r = 0; r < qn; ++r) {
      const T inv = T(1) / l[r];
      for (std::size_t c = 0; c < dv; ++c) ob[r * ldv() + c] *= inv;
      lse_row[r] = m[r] + std::log(l[r]);
    }
  }

  /// p (qn, kn) = the attention weights of those queries and keys, recomputed from the
  /// kept lse.
  void weights(std::size_t i, std::size_t h, std::size_t r0, std::size_t qn, std::size_t c0, std::size_t kn,
               const T* q, const T* k, T* p, T* pack) const {
    scores(i, h, r0, qn, c0, kn, q, k, p, pack);
    const T* lse_row = lse.data() + (i * heads + h) * lq + r0;
    for (std::size_t r = 0; r < qn; ++r) simd::exp_shifted(p + r * kn, kn, lse_row[r]);
  }

  /// ds = p (dp - D) on unmasked scores, 0 on masked ones (their score is a constant).
  void score_grad(std::size_t i, std::size_t c0, std::size_t qn, std::size_t kn, const T* p, const T* dd, T* ds) const {
    for (std::size_t r = 0; r < qn; ++r) {
      const T* pr = p + r * kn;
      T* g = ds + r * kn;
      const T d = dd[r];
      for (std::size_t j = 0; j < kn; ++j) g[j] = pr[j] * (g[j] - d);
    }
    for (std::size_t j : masked[i])
      if (j >= c0 && j < c0 + kn)
        for (std::size_t r = 0; r < qn; ++r) ds[r * kn + j - c0] = T(0);
  }

  /// With P = softmax(s), s = scale q k^T: dv = P^T dout, dP = dout v^T,
  /// ds = P (dP - rowsum(dout o)), dq = scale ds k, dk = scale ds^T q.
  void vjp(const ArrayT<T>& dout, Values<T> x, const ArrayT<T>& out, Slots<T> dx) override {
    T* g[3] = {nullptr, nullptr, nullptr};
    bool fresh[3] = {false, false, false};
    for (int a = 0; a < 3; ++a)
      if (dx[a]) g[a] = dx[a].buffer(fresh[a]).data();
    // an input given twice (k = v) shares one buffer: zero it once, then every block adds
    const bool aliased = (g[0] && (g[0] == g[1] || g[0] == g[2])) || (g[1] && g[1] == g[2]);
    if (aliased || lq == 0)
      for (int a = 0; a < 3; ++a)
        if (g[a] && fresh[a]) {
          std::fill_n(g[a], x[a]->size(), T(0));
          for (int c = 0; c < 3; ++c)
            if (g[c] == g[a]) fresh[c] = false;
        }
    if (!g[0] && !g[1] && !g[2]) return;
    const T *q = x[0]->data(), *k = x[1]->data(), *v = x[2]->data(), *o = out.data(), *go = dout.data();
    const std::size_t qb = block_length(lq);
    parallel::for_each_piece(b * heads, pair_grain(), [&](std::size_t p0, std::size_t p1) {
      const std::size_t kb_max = key_block_bound();
      std::vector<T> p(qb * kb_max), ds(qb * kb_max), dd(qb), scratch(pack_size());
      T* pack = scratch.data();
      for (std::size_t pair = p0; pair < p1; ++pair) {
        const std::size_t i = pair / heads, h = pair % heads, kb = block_length(kend[i]);
        for (std::size_t r0 = 0; r0 < lq; r0 += qb) {
          const std::size_t qn = std::min(qb, lq - r0);
          const T* gob = go + (i * lq + r0) * ldv() + h * dv;
          const T* ob = o + (i * lq + r0) * ldv() + h * dv;
          for (std::size_t r = 0; r < qn; ++r) dd[r] = detail_dot(gob + r * ldv(), ob + r * ldv(), dv);
          for (std::size_t c0 = 0; c0 < kend[i]; c0 += kb) {
            const std::size_t kn = std::min(kb, kend[i] - c0);
            const T beta_k = r0 == 0 ? T(0) : T(1);  // keys: the first query block writes, later ones add
            weights(i, h, r0, qn, c0, kn, q, k, p.data(), pack);
            const T* pw = p.data();
            if (g[2])
              simd::gemm_small<T>(true, false, kn, dv, qn, T(1), pw, kn, gob, ldv(),
                                    fresh[2] ? beta_k : T(1), g[2] + (i * lk + c0) * ldv() + h * dv, ldv(), pack);
            if (!g[0] && !g[1]) continue;
            T* gq = g[0] ? g[0] + (i * lq + r0) * ldq() + h * dk : nullptr;
            T* gk = g[1] ? g[1] + (i * lk + c0) * ldq() + h * dk : nullptr;
            if (uniform[i]) {  // constant scores: no gradient reaches q or k
              if (gq && fresh[0] && c0 == 0) zero_rows(gq, qn, dk, ldq());
              if (gk && fresh[1] && r0 == 0) zero_rows(gk, kn, dk, ldq());
              continue;
            }
            simd::gemm_small<T>(false, true, qn, kn, dv, T(1), gob, ldv(), v + (i * lk + c0) * ldv() + h * dv,
                                  ldv(), T(0), ds.data(), kn, pack);
            score_grad(i, c0, qn, kn, pw, dd.data(), ds.data());
            if (gq)
              simd::gemm_small<T>(false, false, qn, dk, kn, scale, ds.data(), kn, k + (i * lk + c0) * ldq() + h * dk,
                                    ldq(), fresh[0] && c0 == 0 ? T(0) : T(1), gq, ldq(), pack);
            if (gk)
              simd::gemm_small<T>(true, false, kn, dk, qn, scale, ds.data(), kn, q + (i * lq + r0) * ldq() + h * dk,
                                    ldq(), fresh[1] ? beta_k : T(1), gk, ldq(), pack);
          }
        }
        // keys after kend: weight 0, so no gradient
        if (kend[i] < lk) {
          if (g[1] && fresh[1]) zero_rows(g[1] + (i * lk + kend[i]) * ldq() + h * dk, lk - kend[i], dk, ldq());
          if (g[2] && fresh[2]) zero_rows(g[2] + (i * lk + kend[i]) * ldv() + h * dv, lk - kend[i], dv, ldv());
        }
      }
    });
  }

  /// With P = softmax(s): s_dot = scale (q_dot k^T + q k_dot^T) on unmasked scores,
  /// o_dot = (P s_dot) v + P v_dot - rowsum(P s_dot) o, k tangents one after another.
  ArrayT<T> jvp(Values<T> x, Tangents<T> dot, const ArrayT<T>& out, std::size_t kt) override {
    ArrayT<T> r = ArrayT<T>::from_shape(detail::with_k(kt, shape_of(out)));
    const T *q = x[0]->data(), *k = x[1]->data(), *v = x[2]->data(), *o = out.data();
    const std::size_t qb = block_length(lq), nq = x[0]->size(), nk = x[1]->size(), nv = x[2]->size(), no = out.size();
    // each block's weights are recomputed once and serve every tangent in turn
    parallel::for_each_piece(b * heads, pair_grain(), [&](std::size_t p0, std::size_t p1) {
      const std::size_t kb_max = key_block_bound();
      std::vector<T> p(qb * kb_max), sd(qb * kb_max), c(kt * qb), scratch(pack_size());
      T* pack = scratch.data();
      for (std::size_t pair = p0; pair < p1; ++pair) {
        const std::size_t i = pair / heads, h = pair % heads, kb = block_length(kend[i]);
        for (std::size_t r0 = 0; r0 < lq; r0 += qb) {
          const std::size_t qn = std::min(qb, lq - r0);
          std::fill(c.begin(), c.end(), T(0));
          for (std::size_t c0 = 0; c0 < kend[i]; c0 += kb) {
            const std::size_t kn = std::min(kb, kend[i] - c0);
            weights(i, h, r0, qn, c0, kn, q, k, p.data(), pack);
            const T* pw = p.data();
            const T* vb = v + (i * lk + c0) * ldv() + h * dv;
            for (std::size_t t = 0; t < kt; ++t) {
              const T* qd = dot[0] ? dot[0]->data() + t * nq : nullptr;
              const T* kd = dot[1] ? dot[1]->data() + t * nk : nullptr;
              const T* vd = dot[2] ? dot[2]->data() + t * nv : nullptr;
              T* rb = r.data() + t * no + (i * lq + r0) * ldv() + h * dv;
              T* ct = c.data() + t * qb;
              bool any = false;  // s_dot nonzero somewhere
              if (!uniform[i] && (qd || kd)) {
                T beta = T(0);
                if (qd) {
                  simd::gemm_small<T>(false, true, qn, kn, dk, scale, qd + (i * lq + r0) * ldq() + h * dk, ldq(),
                                        k + (i * lk + c0) * ldq() + h * dk, ldq(), T(0), sd.data(), kn, pack);
                  beta = T(1);
                }
                if (kd)
                  simd::gemm_small<T>(false, true, qn, kn, dk, scale, q + (i * lq + r0) * ldq() + h * dk, ldq(),
                                        kd + (i * lk + c0) * ldq() + h * dk, ldq(), beta, sd.data(), kn, pack);
                for (std::size_t rr = 0; rr < qn; ++rr) {  // P s_dot, and its row sums
                  T sum = 0;
                  for (std::size_t j = 0; j < kn; ++j) {
                    sd[rr * kn + j] *= pw[rr * kn + j];
                    sum += sd[rr * kn + j];
                  }
                  ct[rr] += sum;
                }
                simd::gemm_small<T>(false, false, qn, dv, kn, T(1), sd.data(), kn, vb, ldv(), c0 == 0 ? T(0) : T(1),
                                      rb, ldv(), pack);
                any = true;
              }
              if (vd)
                simd::gemm_small<T>(false, false, qn, dv, kn, T(1), pw, kn,
                                      vd + (i * lk + c0) * ldv() + h * dv, ldv(), c0 == 0 && !any ? T(0) : T(1), rb,
                                      ldv(), pack);
              else if (c0 == 0 && !any)
                zero_rows(rb, qn, dv, ldv());
            }
          }
          const T* ob = o + (i * lq + r0) * ldv() + h * dv;
          for (std::size_t t = 0; t < kt; ++t) {
            T* rb = r.data() + t * no + (i * lq + r0) * ldv() + h * dv;
            const T* ct = c.data() + t * qb;
            for (std::size_t rr = 0; rr < qn; ++rr)
              for (std::size_t cc = 0; cc < dv; ++cc) rb[rr * ldv() + cc] -= ct[rr] * ob[rr * ldv() + cc];
          }
        }
      }
    });
    return r;
  }

  static void zero_rows(T* a, std::size_t rows, std::size_t n, std::size_t ld) {
    for (std::size_t r = 0; r < rows; ++r) std::fill_n(a + r * ld, n, T(0));
  }
  static T detail_dot(const T* a, const T* b2, std::size_t n) {
    T s = 0;
    for (std::size_t j = 0; j < n; ++j) s += a[j] * b2[j];
    return s;
  }
};

}  // namespace

template <class T>
TensorT<T> attention(const TensorT<T>& q, const TensorT<T>& k, const TensorT<T>& v, std::size_t heads,
                     const ArrayT<T>& key_mask, double scale) {
  if (heads == 0) throw std::invalid_argument("attention: needs at least one head");
  if (!(scale >= 0) || !std::isfinite(scale)) throw std::invalid_argument("attention: the scale must be finite and >= 0");
  return apply<T>(std::make_unique<AttentionOp<T>>(heads, T(scale), key_mask), {q, k, v});
}

#define DPGRAD_INSTANTIATE(T)                                                                                   \
  template TensorT<T> attention(const TensorT<T>&, const TensorT<T>&, const TensorT<T>&, std::size_t,          \
                                const ArrayT<T>&, double);
DPGRAD_INSTANTIATE(float)
DPGRAD_INSTANTIATE(double)

}  // namespace dpgrad
