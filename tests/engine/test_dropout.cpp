// Dropout against its naive twin: seeded, thread-count-independent masks, scaling, identity in eval.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/context.h"
#include "engine/layers/dropout.h"
#include "engine/reference/elementwise.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using testing::all_near;
using testing::make_tensor;

constexpr double tol = 1e-6;

// The module's mask (kept per element of the buffer, in the tensor's layout) in NCHW order.
std::vector<std::uint8_t> plain_mask(const Dropout& dropout, const dnnl::memory::desc& desc) {
  Tensor t(desc);
  const auto& keep = dropout.mask();
  for (std::size_t i = 0; i < keep.size(); ++i) t.data()[i] = keep[i];
  std::vector<std::uint8_t> mask;
  for (float v : t.to_plain()) mask.push_back(v != 0.0f ? 1 : 0);
  return mask;
}

TEST(DropoutReference, HandWorkedAndLinear) {
  EXPECT_EQ(reference::dropout_forward({1, 2, 3, 4}, {1, 0, 1, 1}, 0.5f), (std::vector<float>{2, 0, 6, 8}));
  EXPECT_EQ(reference::dropout_backward({1, 1, 1, 1}, {0, 1, 1, 0}, 0.75f), (std::vector<float>{0, 4, 4, 0}));
  EXPECT_THROW(reference::dropout_forward({1}, {1}, 1.0f), core::InternalError);
  EXPECT_THROW(reference::dropout_forward({1, 2}, {1}, 0.5f), core::InternalError);

  auto x = gradcheck::random_vector(200, 1);
  std::vector<std::uint8_t> keep(x.size());
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = i % 3 != 0;
  const auto r = gradcheck::random_vector(200, 2);
  auto loss = [&] { return gradcheck::weighted_sum(reference::dropout_forward(x, keep, 0.3f), r); };
  const auto report = gradcheck::check(x, reference::dropout_backward(r, keep, 0.3f), loss);
  EXPECT_TRUE(report.ok()) << report.summary();
}

TEST(Dropout, MatchesTheReferenceWithItsOwnMaskInEveryLayout) {
  const dims_t dims = {3, 7, 7, 13};
  const auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 10);
  const auto dy = gradcheck::random_vector(x.size(), 11);
  for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc}) {
    SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(layout));
    Dropout dropout("classifier.2", 0.3f, 7);
    const Tensor input = make_tensor(dims, x, layout);
    const Tensor& y = dropout.forward(input);
    EXPECT_EQ(y.desc(), input.desc());
    const auto keep = plain_mask(dropout, input.desc());
    EXPECT_TRUE(all_near(y.to_plain(), reference::dropout_forward(x, keep, 0.3f), tol));
    const Tensor& dx = dropout.backward(make_tensor(dims, dy));
    EXPECT_EQ(dx.desc(), input.desc());
    EXPECT_TRUE(all_near(dx.to_plain(), reference::dropout_backward(dy, keep, 0.3f), tol));
  }
}

TEST(Dropout, DropsTheRequestedFraction) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    Dropout dropout("d", p, 3);
    dropout.forward(Tensor::plain({100, 1000}));
    std::size_t dropped = 0;
    for (auto k : dropout.mask()) dropped += k == 0;
    EXPECT_NEAR(static_cast<double>(dropped) / 100000.0, p, 0.01) << "p " << p;
  }
}

TEST(Dropout, MasksFollowTheSeedOnly) {
  const dims_t dims = {64, 512};
  const Tensor x = make_tensor(dims, gradcheck::random_vector(64 * 512, 20));
  auto mask_of = [&](Dropout& d) {
    d.forward(x);
    return d.mask();
  };
  Dropout a("a", 0.5f, 42), b("b", 0.5f, 42), c("c", 0.5f, 43);
  const auto first = mask_of(a);
  EXPECT_EQ(first, mask_of(b)) << "same seed, same mask";
  EXPECT_NE(first, mask_of(c)) << "another seed";
  EXPECT_NE(first, mask_of(a)) << "a new mask every step";
  a.seed(42);
  EXPECT_EQ(mask_of(a), first) << "seed() replays the sequence";

  // Independent of the thread count.
  const int threads = engine::threads();
  set_threads(1);
  Dropout single("s", 0.5f, 42);
  const auto single_thread = mask_of(single);
  set_threads(threads);
  EXPECT_EQ(single_thread, first);
}

TEST(Dropout, EvalAndZeroPAreTheIdentityWithoutACopy) {
  const dims_t dims = {3, 7, 7, 13};
  const auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 30);
  const Tensor input = make_tensor(dims, x, tag::nChw8c);
  Dropout dropout("d", 0.5f);
  dropout.set_mode(Mode::eval);
  const Tensor& y = dropout.forward(input);
  EXPECT_EQ(y.data(), input.data()) << "shares the input's buffer";
  EXPECT_EQ(y.to_plain(), x);
  const Tensor dy = make_tensor(dims, x);
  EXPECT_EQ(dropout.backward(dy).data(), dy.data());

  Dropout none("d", 0.0f);
  EXPECT_EQ(none.forward(input).data(), input.data());

  EXPECT_THROW(Dropout("bad", 1.0f), core::InternalError);
  EXPECT_THROW(Dropout("bad", -0.1f), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
