// Tensors in plain and blocked layouts, reorders, and the engine context.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "engine/context.h"
#include "engine/tensor.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using testing::make_tensor;

TEST(Tensor, PlainIsZeroedNchw) {
  const Tensor t = Tensor::plain({3, 7, 5, 2});
  EXPECT_TRUE(is_plain(t.desc()));
  EXPECT_EQ(t.dims(), (dims_t{3, 7, 5, 2}));
  EXPECT_EQ(t.numel(), 3 * 7 * 5 * 2);
  EXPECT_EQ(t.to_plain(), std::vector<float>(210, 0.0f));
  const Tensor m = Tensor::plain({4, 9});
  EXPECT_EQ(m.desc(), dnnl::memory::desc({4, 9}, dnnl::memory::data_type::f32, tag::nc));
  EXPECT_TRUE(Tensor().empty());
}

// Channel counts that do not fill a block (7, 127) exercise the zero padding of blocked layouts.
TEST(Tensor, BlockedLayoutsRoundTripThroughPlain) {
  for (const auto& dims : {dims_t{3, 7, 7, 13}, dims_t{2, 127, 3, 5}}) {
    const auto values = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 7);
    for (auto layout : {tag::nchw, tag::nhwc, tag::nChw8c, tag::nChw16c}) {
      Tensor t(dnnl::memory::desc(dims, dnnl::memory::data_type::f32, layout));
      t.from_plain(values);
      EXPECT_EQ(t.to_plain(), values) << static_cast<int>(layout);
      EXPECT_EQ(t.reordered_to(plain_desc(dims)).to_plain(), values);
      if (layout != tag::nchw) {
        EXPECT_NE(t.desc(), plain_desc(dims));
        EXPECT_FALSE(is_plain(t.desc()));
      }
    }
  }
}

TEST(Tensor, BlockedElementsSitWhereTheLayoutSays) {
  // nChw8c: element (n, c, h, w) lives at ((n·⌈C/8⌉ + c/8)·H·W + h·W + w)·8 + c%8.
  const dims_t dims = {2, 7, 3, 5};
  std::vector<float> values(static_cast<std::size_t>(product(dims)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const Tensor t = make_tensor(dims, values, tag::nChw8c);
  const float* p = t.data();
  const int n = 1, c = 5, h = 2, w = 3;
  EXPECT_EQ(p[((n * 1 + c / 8) * 3 * 5 + h * 5 + w) * 8 + c % 8], values[((n * 7 + c) * 3 + h) * 5 + w]);
  EXPECT_EQ(p[(0 * 3 * 5 + 0) * 8 + 7], 0.0f) << "the padding channel stays zero";
}

TEST(Tensor, ReorderedToSharesWhenTheLayoutAlreadyMatches) {
  const dims_t dims = {2, 3, 4, 5};
  const Tensor t = make_tensor(dims, gradcheck::random_vector(120, 1));
  EXPECT_EQ(t.reordered_to(t.desc()).data(), t.data());
  const Tensor blocked = t.reordered_to(dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag::nChw8c));
  EXPECT_NE(blocked.data(), t.data());
  EXPECT_EQ(blocked.to_plain(), t.to_plain());
  const Tensor copy = t;  // a handle: shares
  EXPECT_EQ(copy.data(), t.data());
  EXPECT_THROW(t.reordered_to(plain_desc({2, 3, 4, 6})), core::InternalError);
}

TEST(Tensor, FromPlainRejectsTheWrongSize) {
  Tensor t = Tensor::plain({2, 3});
  EXPECT_THROW(t.from_plain(std::vector<float>(5)), core::InternalError);
  EXPECT_THROW(Tensor().from_plain({}), core::InternalError);
}

TEST(Reorderer, PassesMatchingTensorsThroughAndReusesItsBuffer) {
  const dims_t dims = {3, 7, 7, 13};
  const auto values = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 2);
  const Tensor plain = make_tensor(dims, values);
  const dnnl::memory::desc blocked(dims, dnnl::memory::data_type::f32, tag::nChw8c);
  Reorderer reorder;
  EXPECT_EQ(&reorder(plain, plain.desc()), &plain);
  const Tensor& a = reorder(plain, blocked);
  EXPECT_EQ(a.desc(), blocked);
  EXPECT_EQ(a.to_plain(), values);
  const float* buffer = a.data();
  const Tensor other = make_tensor(dims, gradcheck::random_vector(values.size(), 3));
  const Tensor& b = reorder(other, blocked);
  EXPECT_EQ(b.data(), buffer);
  EXPECT_EQ(b.to_plain(), other.to_plain());
}

TEST(AccumulatingReorder, AddsIntoThePlainDestination) {
  const dims_t dims = {8, 7, 3, 3};
  const auto grad = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 4);
  const Tensor blocked = make_tensor(dims, grad, tag::OIhw8i8o);
  std::vector<float> sum = gradcheck::random_vector(grad.size(), 5);
  std::vector<float> expected = sum;
  for (std::size_t i = 0; i < grad.size(); ++i) expected[i] += grad[i];
  AccumulatingReorder accumulate;
  accumulate(blocked.memory(), wrap_plain(sum, dims));
  EXPECT_TRUE(testing::all_near(sum, expected, 1e-7));
}

TEST(Context, ThreadsDefaultToTheAvailableCoresAndCanBeSet) {
  Context& context = Context::get();
  EXPECT_EQ(&context, &Context::get());
  const int initial = threads();
  EXPECT_GE(initial, 1);
  set_threads(1);
  EXPECT_EQ(threads(), 1);
  set_threads(0);
  EXPECT_GE(threads(), 1);
  set_threads(initial);
  EXPECT_EQ(threads(), initial);
}

}  // namespace
}  // namespace tessera::engine
