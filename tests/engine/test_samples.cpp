// The per-sample axis through ops: each rule on small shapes, with the layout
// it should give worked out by hand; and the refusals of the per-sample rules
// for uses whose input is not per-sample on axis 0.
#include <doctest/doctest.h>

#include "engine/ops.hpp"
#include "engine/per_sample.hpp"
#include "engine/tape.hpp"
#include "support/check.hpp"

using namespace dpgrad;
using test::randn;
using D = TensorT<double>;
using A = ArrayT<double>;
using K = Samples::Kind;

namespace {
A zeros(const Shape& s) { return xt::zeros<double>(s); }
}  // namespace

TEST_CASE("samples: leaves: the batch's data on its axis, constants and parameters with none") {
  D x = per_sample_input(zeros({3, 4}));
  CHECK(x.samples() == Samples::at(0, 3));
  CHECK(per_sample_input(zeros({4, 6, 2}), 1, 3).samples() == Samples::at(1, 3));
  CHECK(per_sample_input(zeros({0, 4})).samples() == Samples::at(0, 0));  // an empty batch
  CHECK(linear(per_sample_input(zeros({0, 4})), constant(zeros({4, 2}))).samples() == Samples::at(0, 0));
  CHECK(D(zeros({3, 4})).samples().is_none());
  CHECK(constant(zeros({3, 4})).samples().is_none());
  CHECK(make_parameter<double>("w", zeros({3, 4})).samples().is_none());
  test::check_error<std::invalid_argument>([] { per_sample_input(zeros({3, 4}), 2); }, {"axis 2 out of range"});
  test::check_error<std::invalid_argument>([] { per_sample_input(zeros({6, 4}), 0, 4); }, {"4 samples do not divide"});
}

TEST_CASE("samples: elementwise ops keep the axis; broadcasting aligns trailing axes") {
  D x = per_sample_input(zeros({2, 3}));
  CHECK(tanh(x).samples() == Samples::at(0, 2));
  CHECK(scale(x, 2.0).samples() == Samples::at(0, 2));
  CHECK(add(x, constant(zeros({3}))).samples() == Samples::at(0, 2));  // a bias
  CHECK(mul(x, x).samples() == Samples::at(0, 2));
  // (2, 3) against (4, 2, 3): the samples move to axis 1
  CHECK(add(x, constant(zeros({4, 2, 3}))).samples() == Samples::at(1, 2));
  // an outer sum x_i + x_j: element (i, j) depends on samples i and j
  D col = reshape(per_sample_input(zeros({2})), {2, 1});
  D row = reshape(per_sample_input(zeros({2})), {1, 2});
  CHECK(col.samples() == Samples::at(0, 2));
  CHECK(row.samples() == Samples::at(1, 2));
  CHECK(add(col, row).samples().kind == K::mixed);
  // one sample broadcast along the other's per-sample axis
  CHECK(add(per_sample_input(zeros({1, 3})), x).samples().kind == K::axis);
  CHECK(add(per_sample_input(zeros({1, 3})), x).samples().count == 1);
}

TEST_CASE("samples: reductions over the per-sample axis mix, over others shift it") {
  D x = per_sample_input(zeros({4, 2, 3}), 1);
  CHECK(sum(x, {0}).samples() == Samples::at(0, 2));
  CHECK(sum(x, {0}, true).samples() == Samples::at(1, 2));
  CHECK(mean(x, {2}).samples() == Samples::at(1, 2));
  CHECK(mean(x, {1}).samples().kind == K::mixed);
  CHECK(sum(x).samples().kind == K::mixed);
}

TEST_CASE("samples: reshape is exact: merges with later axes keep the blocks, with earlier axes mix") {
  D x = per_sample_input(zeros({2, 4, 3}));  // (B, T, d)
  CHECK(reshape(x, {8, 3}).samples() == Samples::at(0, 2));   // (B T, d): sample i owns rows 4i..4i+3
  CHECK(reshape(x, {2, 12}).samples() == Samples::at(0, 2));
  CHECK(reshape(x, {1, 2, 12}).samples() == Samples::at(1, 2));
  CHECK(reshape(x, {24}).samples() == Samples::at(0, 2));
  D tm = transpose(x, {1, 0, 2});  // (T, B, d), per-sample axis 1
  CHECK(tm.samples() == Samples::at(1, 2));
  CHECK(reshape(tm, {8, 3}).samples() == Samples::interleaved(0, 2, 4));  // (T B, d): rows interleave the samples
  CHECK(reshape(tm, {4, 6}).samples() == Samples::at(1, 2));
  // rows of B = 3 examples of 2 views each, to (examples, views): one block per example
  D rows = per_sample_input(zeros({6}));
  CHECK(reshape(rows, {3, 2}).samples() == Samples::at(0, 3));
  // the same rows regrouped (2, 3): blocks cut examples apart, the finest whole blocks are 2 of 3 rows
  CHECK(reshape(rows, {2, 3}).samples() == Samples::at(0, 2));
  // marked as 3 examples of 2 rows: (3, 2) is exact
  CHECK(reshape(per_sample_input(zeros({6}), 0, 3), {3, 2}).samples() == Samples::at(0, 3));
}

TEST_CASE("samples: reshape follows a batch axis merged with another axis on either side") {
  const std::size_t L = 3, B = 2, d = 4, heads = 2;
  D x = transpose(per_sample_input(zeros({B, L, d})), {1, 0, 2});  // (L, B, d), per-sample axis 1
  // the heads of attention, sequence-first: (L, B, d) -> (L, B heads, d / heads): the batch outer
  D split = reshape(x, {L, B * heads, d / heads});
  CHECK(split.samples() == Samples::at(1, B));
  CHECK(transpose(split, {1, 0, 2}).samples() == Samples::at(0, B));  // (B heads, L, d / heads): blocks of heads rows
  // the output projection's rows: (L, B, d) -> (L B, d): the batch inner, L runs of B samples
  D rows = reshape(x, {L * B, d});
  CHECK(rows.samples() == Samples::interleaved(0, B, L));
  CHECK(rows.samples().on_axis(0));
  CHECK_FALSE(rows.samples().blocks_on(0));
  // and back: (L B, d) -> (L, B, d) puts the samples on axis 1 again
  CHECK(reshape(rows, {L, B, d}).samples() == Samples::at(1, B));
  CHECK(reshape(rows, {L, B * d}).samples() == Samples::at(1, B));
  // a linear map of the rows keeps them; elementwise ops keep them
  CHECK(linear(rows, constant(zeros({d, 5}))).samples() == Samples::interleaved(0, B, L));
  CHECK(tanh(rows).samples() == Samples::interleaved(0, B, L));
  CHECK(add(rows, rows).samples() == Samples::interleaved(0, B, L));
  // blocks and interleaved rows of the same length do not line up: mixed
  CHECK(add(rows, per_sample_input(zeros({L * B, d}), 0, B)).samples().kind == K::mixed);
  // the batch with heads merged inside, (B heads, L, dk) -> (L, B heads, dk) -> (L B, d): interleaved again
  D heads_first = transpose(split, {1, 0, 2});
  CHECK(reshape(transpose(heads_first, {1, 0, 2}), {L * B, d}).samples() == Samples::interleaved(0, B, L));
  // flat: (L, B, d) -> (L B d): blocks of d, L runs of them
  CHECK(reshape(x, {L * B * d}).samples() == Samples::interleaved(0, B, L));
  // a reduction over the merged axis mixes; softmax along it mixes
  CHECK(sum(rows, {0}).samples().kind == K::mixed);
  CHECK(softmax(rows, 0).samples().kind == K::mixed);
  CHECK(softmax(rows, 1).samples() == Samples::interleaved(0, B, L));
}

TEST_CASE("samples: a reshape that truly mixes samples is still refused") {
  // (L, B, d) -> (B, L d) with B not dividing L: no axis holds a sample's elements as blocks
  D x = transpose(per_sample_input(zeros({3, 4, 5})), {1, 0, 2});  // (4, 3, 5)
  CHECK(reshape(x, {3, 20}).samples().kind == K::mixed);
  // with B dividing L the rows hold several samples each, along the last axis, which linear contracts
  D y = transpose(per_sample_input(zeros({2, 4, 5})), {1, 0, 2});  // (4, 2, 5)
  const Samples s = reshape(y, {2, 20}).samples();
  CHECK(s == Samples::interleaved(1, 2, 2));
  CHECK(linear(reshape(y, {2, 20}), constant(zeros({20, 3}))).samples().kind == K::mixed);
  // (B, T) -> (T, B) as a reshape, not a transpose: sample 0's 3 elements fill rows 0 and 1 in part; the
  // only whole blocks left are one block of everything, which the rules refuse for a batch of 2
  CHECK(reshape(per_sample_input(zeros({2, 3})), {3, 2}).samples() == Samples::at(0, 1));
  // on (2, 4) -> (4, 2), sample 0's 4 elements are rows 0 and 1: exact
  CHECK(reshape(per_sample_input(zeros({2, 4})), {4, 2}).samples() == Samples::at(0, 2));
  // the per-sample rules refuse interleaved rows for every op but linear, which moves them (next test)
  FastRng rng(7);
  D w = make_parameter<double>("table", randn<double>({4, 3}, rng));
  D rows = reshape(transpose(per_sample_input(A(randn<double>({2, 3, 3}, rng))), {1, 0, 2}), {6, 3});
  TapeT<double> tape;
  tape.record_uses(true, false);
  {
    RecordScope<double> scope(tape);
    tape.backward(sum(mul(rows, make_parameter<double>("scale", randn<double>({3}, rng)))));
  }
  test::check_error<std::invalid_argument>([&] { per_sample_norms_squared(tape.uses()[0], 2); },
                                           {"parameter 'scale' is used by mul", "interleaved along axis 0"});
}

TEST_CASE("samples: linear on rows with the batch inner gives the per-sample gradients of the batch-major one") {
  // y = x W + b on the rows (L B, d) of x (L, B, d), as PyTorch's exports
  // feed an attention's output projection; losses sum u * tanh(y) per sample.
  FastRng rng(11);
  const std::size_t L = 3, d = 4, p = 2;
  for (std::size_t B : {1, 2, 3}) {
    CAPTURE(B);
    A data = randn<double>({B, L, d}, rng), u = randn<double>({B, L, p}, rng);
    D w = make_parameter<double>("w", randn<double>({d, p}, rng));
    D b = make_parameter<double>("b", randn<double>({p}, rng));
    auto per_sample = [&](bool rows) {
      TapeT<double> tape;
      tape.record_uses(true, false);
      {
        RecordScope<double> scope(tape);
        D x = per_sample_input(data);
        D y;
        if (rows) {
          D r = reshape(transpose(x, {1, 0, 2}), {L * B, d});
          CHECK(r.samples() == (B == 1 ? Samples::at(0, 1) : Samples::interleaved(0, B, L)));
          y = transpose(reshape(linear(r, w, b), {L, B, p}), {1, 0, 2});
        } else {
          y = linear(x, w, b);
        }
        D losses = sum(mul(tanh(y), constant(u)), {1, 2});  // (B)
        check_per_sample_tape(tape, losses, B);
        tape.backward(sum(losses));
      }
      std::vector<A> g;
      for (const auto& group : tape.uses()) {
        g.push_back(per_sample_gradients(group, B));
        A c = randn<double>({B}, rng);
        A want = xt::zeros<double>(group.param->value.shape());
        for (std::size_t i = 0; i < B; ++i) want += c(i) * A(xt::view(g.back(), i));
        DPGRAD_CHECK_CLOSE(weighted_gradient_sum(group, c), want, 1e-12);
        for (auto method : {NormMethod::ghost, NormMethod::materialise}) {
          A sq = xt::zeros<double>({B});
          const std::size_t n = g.back().size() / B;
          for (std::size_t i = 0; i < B; ++i)
            for (std::size_t k = 0; k < n; ++k) sq(i) += g.back().data()[i * n + k] * g.back().data()[i * n + k];
          DPGRAD_CHECK_CLOSE(per_sample_norms_squared(group, B, method), sq, 1e-12);
        }
      }
      return g;
    };
    auto batch_major = per_sample(false), rows = per_sample(true);
    REQUIRE(rows.size() == 2);
    DPGRAD_CHECK_CLOSE(rows[0], batch_major[0], 1e-12);
    DPGRAD_CHECK_CLOSE(rows[1], batch_major[1], 1e-12);
  }
}

TEST_CASE("samples: transpose moves the axis; slicing along it leaves a subset; concat along it mixes") {
  D x = per_sample_input(zeros({2, 4, 3}));
  CHECK(transpose(x, {2, 0, 1}).samples() == Samples::at(1, 2));
  CHECK(slice(x, 1, 0, 2).samples() == Samples::at(0, 2));
  CHECK(slice(x, 0, 0, 2).samples() == Samples::at(0, 2));  // the whole axis
  CHECK(slice(x, 0, 1, 2).samples() == Samples::subset(0));
  CHECK(tanh(slice(x, 0, 1, 2)).samples() == Samples::subset(0));
  CHECK(concat<double>({x, x}, 2).samples() == Samples::at(0, 2));
  CHECK(concat<double>({x, constant(zeros({2, 1, 3}))}, 1).samples() == Samples::at(0, 2));
  CHECK(concat<double>({x, x}, 0).samples().kind == K::mixed);
  CHECK(stack<double>({x, x}, 0).samples() == Samples::at(1, 2));
}

TEST_CASE("samples: parametric ops and losses work row by row") {
  FastRng rng(1);
  D w = make_parameter<double>("w", randn<double>({3, 5}, rng));
  D x = per_sample_input(randn<double>({2, 4, 3}, rng));
  CHECK(linear(x, w).samples() == Samples::at(0, 2));
  CHECK(linear(transpose(x, {1, 0, 2}), w).samples() == Samples::at(1, 2));
  // contracting the per-sample axis mixes
  CHECK(linear(transpose(x, {1, 2, 0}), make_parameter<double>("v", randn<double>({2, 5}, rng))).samples().kind ==
        K::mixed);
  // a weight that holds samples mixes them into every output
  CHECK(linear(constant(zeros({4, 2})), per_sample_input(zeros({2, 3}))).samples().kind == K::mixed);
  ArrayT<std::int32_t> ids = {{1, 2}, {0, 1}, {2, 2}};
  CHECK(gather(w, ids).samples() == Samples::at(0, 3));
  D logits = per_sample_input(randn<double>({3, 4}, rng));
  CHECK(cross_entropy(logits, {0, 1, 2}).samples() == Samples::at(0, 3));
  CHECK(cross_entropy(transpose(per_sample_input(randn<double>({4, 4}, rng)), {1, 0}), {0, 1, 2, 3}).samples().kind ==
        K::mixed);
  CHECK(mean_cross_entropy(logits, {0, 1, 2}).samples().kind == K::mixed);
}

TEST_CASE("samples: the per-sample rules refuse a use whose input is not per-sample on axis 0") {
  FastRng rng(2);
  D w = make_parameter<double>("dense.weight", randn<double>({3, 2}, rng));
  D b = make_parameter<double>("dense.bias", randn<double>({2}, rng));
  auto run = [&](const D& x, std::size_t batch) {
    TapeT<double> tape;
    tape.record_uses(true, false);
    RecordScope<double> scope(tape);
    tape.backward(sum(linear(x, w, b)));
    REQUIRE(tape.uses().size() == 2);
    for (const auto& g : tape.uses()) per_sample_norms_squared(g, batch);
  };
  A x = randn<double>({4, 2, 3}, rng);  // (T, B, d)
  run(per_sample_input(A(randn<double>({2, 4, 3}, rng))), 2);  // axis 0: accepted
  run(per_sample_input(x, 1), 2);                              // axis 1: moved to the front (next test)
  // samples on the contracted axis: (B, T, d) read as (d, T, B)
  D by_column = transpose(per_sample_input(A(randn<double>({3, 4, 3}, rng))), {2, 1, 0});
  test::check_error<std::invalid_argument>(
      [&] { run(by_column, 3); },
      {"parameter 'dense.weight' is used by linear on an input whose per-sample axis is 2, not 0"});
  test::check_error<std::invalid_argument>([&] { run(D(x), 4); }, {"'dense.weight'", "holds no samples"});
  D data = per_sample_input(A(randn<double>({3, 3}, rng)));
  test::check_error<std::invalid_argument>([&] { run(sub(data, mean(data, {0}, true)), 3); },
                                           {"'dense.weight' is used by linear on an input that mixes samples"});
  test::check_error<std::invalid_argument>([&] { run(slice(data, 0, 1, 3), 2); }, {"subset of the samples"});
  test::check_error<std::invalid_argument>([&] { run(data, 2); }, {"holds 3 samples, not the batch's 2"});
  // the bias use is refused with its weight: it reads the same rows
  TapeT<double> tape;
  tape.record_uses(true, false);
  {
    RecordScope<double> scope(tape);
    tape.backward(sum(linear(data, w, b)));
  }
  test::check_error<std::invalid_argument>([&] { per_sample_norms_squared(tape.uses()[1], 2); },
                                           {"parameter 'dense.bias' is used by linear on an input whose per-sample "
                                            "axis holds 3 samples"});
}

TEST_CASE("samples: a time-major linear use gives the per-sample gradients of the batch-major one") {
  // y = x W + b on x (T, B, d) = transpose of the batch's (B, T, d); the losses
  // sum_t,p u * tanh(y) per sample. The uses keep x and delta with B first.
  FastRng rng(3);
  const std::size_t T = 4, d = 3, p = 2;
  for (std::size_t B : {2, 3}) {
    CAPTURE(B);
    A data = randn<double>({B, T, d}, rng), u = randn<double>({B, T, p}, rng);
    D w = make_parameter<double>("w", randn<double>({d, p}, rng));
    D b = make_parameter<double>("b", randn<double>({p}, rng));
    auto per_sample = [&](bool time_major) {
      TapeT<double> tape;
      tape.record_uses(true, false);
      {
        RecordScope<double> scope(tape);
        D x = per_sample_input(data);
        D y = time_major ? transpose(linear(transpose(x, {1, 0, 2}), w, b), {1, 0, 2}) : linear(x, w, b);
        D losses = sum(mul(tanh(y), constant(u)), {1, 2});  // (B)
        check_per_sample_tape(tape, losses, B);
        tape.backward(sum(losses));
      }
      std::vector<A> g;
      for (const auto& group : tape.uses()) {
        g.push_back(per_sample_gradients(group, B));
        A c = randn<double>({B}, rng);
        A want = xt::zeros<double>(group.param->value.shape());
        for (std::size_t i = 0; i < B; ++i) want += c(i) * A(xt::view(g.back(), i));
        DPGRAD_CHECK_CLOSE(weighted_gradient_sum(group, c), want, 1e-12);
        A sq = xt::zeros<double>({B});
        const std::size_t n = g.back().size() / B;
        for (std::size_t i = 0; i < B; ++i)
          for (std::size_t k = 0; k < n; ++k) sq(i) += g.back().data()[i * n + k] * g.back().data()[i * n + k];
        DPGRAD_CHECK_CLOSE(per_sample_norms_squared(group, B, NormMethod::ghost), sq, 1e-12);
      }
      return g;
    };
    auto batch_major = per_sample(false), time_major = per_sample(true);
    REQUIRE(time_major.size() == 2);
    DPGRAD_CHECK_CLOSE(time_major[0], batch_major[0], 1e-12);
    DPGRAD_CHECK_CLOSE(time_major[1], batch_major[1], 1e-12);
    // and one sample's gradient by itself: sample 1 of the batch alone
    w.zero_grad();
    {
      TapeT<double> tape;
      RecordScope<double> scope(tape);
      D x = constant(A(xt::view(data, xt::range(1, 2))));
      tape.backward(sum(mul(tanh(linear(x, w, b)), constant(A(xt::view(u, xt::range(1, 2)))))));
    }
    DPGRAD_CHECK_CLOSE(w.grad(), A(xt::view(batch_major[0], 1)), 1e-12);
    w.zero_grad();
    b.zero_grad();
  }
}

TEST_CASE("samples: per-sample losses must be one per sample of the batch") {
  D x = per_sample_input(zeros({3, 2}));
  check_per_sample_losses(sum(x, {1}), 3);
  test::check_error<std::invalid_argument>([&] { check_per_sample_losses(sum(x, {1}), 2); }, {"per-sample losses"});
  test::check_error<std::invalid_argument>([&] { check_per_sample_losses(sum(sub(x, mean(x, {0}, true)), {1}), 3); },
                                           {"mixed samples"});
  test::check_error<std::invalid_argument>([&] { check_per_sample_losses(sum(D(zeros({3, 2})), {1}), 3); },
                                           {"no samples"});
}

TEST_CASE("samples: a batch of one sample: nothing done to it mixes it") {
  // Poisson sampling draws batches of one; whatever axis the one sample is said to lie on, every element is its own
  D x = per_sample_input(zeros({1, 3, 4}));
  CHECK(sum(x, {0}).samples() == Samples::at(0, 1));
  CHECK(sum(x).samples().kind == K::mixed);  // a scalar has no axis to hold it
  CHECK(reshape(transpose(x, {1, 0, 2}), {3, 4}).samples() == Samples::at(0, 1));
  CHECK(concat<double>({x, x}, 0).samples() == Samples::at(0, 1));
  CHECK(softmax(x, 0).samples() == x.samples());
  CHECK(slice(x, 0, 0, 1).samples() == x.samples());
  CHECK(add(transpose(x, {1, 0, 2}), reshape(x, {3, 1, 4})).samples() == Samples::at(0, 1));
  CHECK(linear(transpose(x, {1, 2, 0}), constant(zeros({1, 2}))).samples().count == 1);
  // and the rules accept its uses on any axis for a batch of one
  FastRng rng(13);
  D w = make_parameter<double>("w", randn<double>({4, 2}, rng));
  TapeT<double> tape;
  tape.record_uses(true, false);
  {
    RecordScope<double> scope(tape);
    tape.backward(sum(linear(transpose(x, {1, 0, 2}), w)));
  }
  CHECK(per_sample_norms_squared(tape.uses()[0], 1).size() == 1);
}
