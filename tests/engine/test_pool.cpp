// Max, average and global average pooling on oneDNN against their naive twins, and the twins against
// central differences and hand-worked cases.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "core/error.h"
#include "engine/layers/global_pool.h"
#include "engine/layers/pool.h"
#include "engine/reference/pool.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using reference::PoolInput;
using reference::PoolWindow;
using testing::all_near;
using testing::make_tensor;

constexpr double tol = 1e-5;

std::vector<float> iota(int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i + 1);
  return v;
}

// --- References --------------------------------------------------------------------------------------------

TEST(PoolReference, HandWorkedMaxAndAverage) {
  // 1 2 3
  // 4 5 6      3×3 kernel, stride 2, padding 1 → 2×2 windows centred on the corners
  // 7 8 9
  const PoolInput s{1, 1, 3, 3};
  const PoolWindow w{3, 3, 2, 2, 1, 1};
  EXPECT_EQ(reference::max_pool_forward(iota(9), s, w), (std::vector<float>{5, 6, 8, 9}));
  // Top-left window holds 1 2 4 5 and five padding zeros.
  EXPECT_EQ(reference::avg_pool_forward(iota(9), s, w, true),
            (std::vector<float>{12 / 9.f, 16 / 9.f, 24 / 9.f, 28 / 9.f}));
  EXPECT_EQ(reference::avg_pool_forward(iota(9), s, w, false), (std::vector<float>{3, 4, 6, 7}));
  // Backward: the max of every window is its image corner cell nearest the centre.
  EXPECT_EQ(reference::max_pool_backward(iota(9), {1, 2, 3, 4}, s, w), (std::vector<float>{0, 0, 0, 0, 1, 2, 0, 3, 4}));
  // A tie goes to the first cell in row-major order.
  EXPECT_EQ(reference::max_pool_backward({1, 1, 1, 1}, {1}, {1, 1, 2, 2}, {2, 2, 2, 2, 0, 0}),
            (std::vector<float>{1, 0, 0, 0}));
  // Adaptive 3 → 2 rows: windows [0, 2) and [1, 3) overlap, as PyTorch's.
  EXPECT_EQ(reference::adaptive_avg_pool_forward(iota(9), s, 2, 1), (std::vector<float>{3.5f, 6.5f}));
  EXPECT_EQ(reference::adaptive_avg_pool_forward(iota(9), s, 1, 1), (std::vector<float>{5}));
}

TEST(PoolReference, RejectsWindowsThatDoNotFit) {
  EXPECT_THROW(reference::max_pool_forward(iota(9), {1, 1, 3, 3}, {5, 5, 1, 1, 0, 0}), core::InternalError);
  EXPECT_THROW(reference::max_pool_forward(iota(9), {1, 1, 3, 3}, {2, 2, 1, 1, 2, 2}), core::InternalError)
      << "padding beyond half the kernel";
  EXPECT_THROW(reference::max_pool_forward(iota(8), {1, 1, 3, 3}, {2, 2, 1, 1, 0, 0}), core::InternalError);
}

struct ReferenceCase {
  PoolWindow window;
  bool count_include_pad;
};

TEST(PoolReference, BackwardMatchesCentralDifferences) {
  const PoolInput s{2, 3, 7, 13};
  for (const auto& c : {ReferenceCase{{3, 3, 2, 2, 1, 1}, true}, ReferenceCase{{3, 3, 2, 2, 1, 1}, false},
                        ReferenceCase{{2, 3, 2, 1, 0, 1}, true}}) {
    auto x = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 11);
    const int dst_size = s.n * s.c * c.window.out_h(s.h) * c.window.out_w(s.w);
    const auto r = gradcheck::random_vector(static_cast<std::size_t>(dst_size), 12);
    auto max_loss = [&] { return gradcheck::weighted_sum(reference::max_pool_forward(x, s, c.window), r); };
    auto report = gradcheck::check(x, reference::max_pool_backward(x, r, s, c.window), max_loss, {.max_points = 600});
    EXPECT_TRUE(report.ok()) << "max: " << report.summary();
    auto avg_loss = [&] {
      return gradcheck::weighted_sum(reference::avg_pool_forward(x, s, c.window, c.count_include_pad), r);
    };
    report = gradcheck::check(x, reference::avg_pool_backward(r, s, c.window, c.count_include_pad), avg_loss,
                              {.max_points = 600});
    EXPECT_TRUE(report.ok()) << "avg: " << report.summary();
  }
}

TEST(PoolReference, AdaptiveBackwardMatchesCentralDifferences) {
  const PoolInput s{2, 3, 7, 13};
  for (auto [oh, ow] : {std::pair{1, 1}, std::pair{3, 5}}) {
    auto x = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 13);
    const auto r = gradcheck::random_vector(static_cast<std::size_t>(s.n * s.c * oh * ow), 14);
    auto loss = [&] { return gradcheck::weighted_sum(reference::adaptive_avg_pool_forward(x, s, oh, ow), r); };
    const auto report =
        gradcheck::check(x, reference::adaptive_avg_pool_backward(r, s, oh, ow), loss, {.max_points = 600});
    EXPECT_TRUE(report.ok()) << oh << "x" << ow << ": " << report.summary();
  }
}

// --- oneDNN modules ----------------------------------------------------------------------------------------

struct PoolCase {
  int channels;
  Pool2dOptions options;
};

std::vector<PoolCase> pool_cases() {
  return {{7, {.kernel = 3, .stride = 2, .padding = 1}},
          {127, {.kernel = 3, .stride = 2, .padding = 1}},
          {7, {.kernel = 2}},
          {7, {.kernel = 3, .stride = 1, .padding = 1, .count_include_pad = false}}};
}

PoolWindow window_of(const Pool2dOptions& o) {
  const int stride = o.stride == 0 ? o.kernel : o.stride;
  return {o.kernel, o.kernel, stride, stride, o.padding, o.padding};
}

TEST(MaxPool2d, MatchesTheReferenceInEveryLayout) {
  for (const auto& c : pool_cases()) {
    const PoolInput s{3, c.channels, 7, 13};
    const PoolWindow w = window_of(c.options);
    const dims_t dims = {s.n, s.c, s.h, s.w};
    const auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 21);
    const auto diff_dst =
        gradcheck::random_vector(static_cast<std::size_t>(s.n * s.c * w.out_h(s.h) * w.out_w(s.w)), 22);
    const auto dst = reference::max_pool_forward(src, s, w);
    const auto diff_src = reference::max_pool_backward(src, diff_dst, s, w);
    for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc}) {
      SCOPED_TRACE(::testing::Message() << "C " << c.channels << ", kernel " << c.options.kernel << ", layout "
                                        << static_cast<int>(layout));
      MaxPool2d pool("features.2", c.options);
      const Tensor x = make_tensor(dims, src, layout);
      const Tensor& y = pool.forward(x);
      EXPECT_EQ(y.dims(), (dims_t{s.n, s.c, w.out_h(s.h), w.out_w(s.w)}));
      EXPECT_EQ(y.desc(), dnnl::memory::desc(y.dims(), dnnl::memory::data_type::f32, layout)) << "src's layout";
      EXPECT_EQ(y.to_plain(), dst) << "a max is exact";
      const Tensor& dx = pool.backward(make_tensor(y.dims(), diff_dst));
      EXPECT_EQ(dx.desc(), x.desc());
      EXPECT_TRUE(all_near(dx.to_plain(), diff_src, tol));
    }
  }
}

TEST(AvgPool2d, MatchesTheReferenceInEveryLayout) {
  for (const auto& c : pool_cases()) {
    const PoolInput s{3, c.channels, 7, 13};
    const PoolWindow w = window_of(c.options);
    const dims_t dims = {s.n, s.c, s.h, s.w};
    const auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 23);
    const auto diff_dst =
        gradcheck::random_vector(static_cast<std::size_t>(s.n * s.c * w.out_h(s.h) * w.out_w(s.w)), 24);
    const auto dst = reference::avg_pool_forward(src, s, w, c.options.count_include_pad);
    const auto diff_src = reference::avg_pool_backward(diff_dst, s, w, c.options.count_include_pad);
    for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc}) {
      SCOPED_TRACE(::testing::Message() << "C " << c.channels << ", kernel " << c.options.kernel << ", layout "
                                        << static_cast<int>(layout));
      AvgPool2d pool("pool", c.options);
      const Tensor x = make_tensor(dims, src, layout);
      const Tensor& y = pool.forward(x);
      EXPECT_EQ(y.desc().dims(), (dims_t{s.n, s.c, w.out_h(s.h), w.out_w(s.w)}));
      EXPECT_TRUE(all_near(y.to_plain(), dst, tol));
      const Tensor& dx = pool.backward(make_tensor(y.dims(), diff_dst, tag::nChw8c));
      EXPECT_EQ(dx.desc(), x.desc());
      EXPECT_TRUE(all_near(dx.to_plain(), diff_src, tol));
    }
  }
}

// Central differences through the oneDNN module itself (not only through its twin).
template <class Pool>
void check_module_gradient(const Pool2dOptions& options, tag layout) {
  const dims_t dims = {2, 7, 7, 13};
  Pool pool("pool", options);
  auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 31);
  Tensor input = make_tensor(dims, x, layout);
  const Tensor& y = pool.forward(input);
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 32);
  const auto analytic = pool.backward(make_tensor(y.dims(), r)).to_plain();
  auto loss = [&] {
    input.from_plain(x);
    return gradcheck::weighted_sum(pool.forward(input).to_plain(), r);
  };
  const auto report = gradcheck::check(x, analytic, loss, {.step = 1e-2, .max_points = 120});
  EXPECT_TRUE(report.ok()) << pool.type() << ": " << report.summary();
}

TEST(Pool2d, GradientsMatchCentralDifferences) {
  check_module_gradient<MaxPool2d>({.kernel = 3, .stride = 2, .padding = 1}, tag::nChw8c);
  check_module_gradient<AvgPool2d>({.kernel = 3, .stride = 2, .padding = 1}, tag::nChw8c);
  check_module_gradient<AvgPool2d>({.kernel = 3, .stride = 2, .padding = 1, .count_include_pad = false}, tag::nchw);
}

TEST(MaxPool2d, EvalModeComputesTheSameAndRefusesBackward) {
  const dims_t dims = {3, 7, 7, 13};
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 41);
  MaxPool2d pool("maxpool", {.kernel = 3, .stride = 2, .padding = 1});
  const Tensor x = make_tensor(dims, src, tag::nChw8c);
  const auto train = pool.forward(x).to_plain();
  pool.set_mode(Mode::eval);
  const Tensor& y = pool.forward(x);
  EXPECT_EQ(y.to_plain(), train);
  EXPECT_THROW(pool.backward(make_tensor(y.dims(), train)), core::InternalError);
  pool.set_mode(Mode::train);
  const Tensor& y2 = pool.forward(x);
  EXPECT_NO_THROW(pool.backward(make_tensor(y2.dims(), train)));
}

TEST(Pool2d, RejectsBadWindowsAndInputs) {
  EXPECT_THROW(MaxPool2d("p", {.kernel = 2, .padding = 2}), core::InternalError);
  EXPECT_THROW(AvgPool2d("p", {.kernel = 0}), core::InternalError);
  MaxPool2d pool("p", {.kernel = 5});
  EXPECT_THROW(pool.forward(Tensor::plain({1, 3, 4, 4})), core::InternalError) << "smaller than the kernel";
  EXPECT_THROW(pool.forward(Tensor::plain({1, 3})), core::InternalError) << "2-D";
  MaxPool2d no_down("p", {.kernel = 2});
  no_down.set_propagate_down(false);
  const Tensor& y = no_down.forward(Tensor::plain({1, 3, 4, 4}));
  EXPECT_TRUE(no_down.backward(y).empty());
}

TEST(AdaptiveAvgPool2d, AveragesEachChannelIntoAPlainNxC) {
  for (int channels : {7, 127}) {
    const PoolInput s{3, channels, 7, 13};
    const dims_t dims = {s.n, s.c, s.h, s.w};
    const auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 51);
    const auto diff_dst = gradcheck::random_vector(static_cast<std::size_t>(s.n * s.c), 52);
    const auto dst = reference::adaptive_avg_pool_forward(src, s, 1, 1);
    const auto diff_src = reference::adaptive_avg_pool_backward(diff_dst, s, 1, 1);
    for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc}) {
      SCOPED_TRACE(::testing::Message() << "C " << channels << ", layout " << static_cast<int>(layout));
      AdaptiveAvgPool2d pool("avgpool");
      const Tensor x = make_tensor(dims, src, layout);
      const Tensor& y = pool.forward(x);
      EXPECT_EQ(y.desc(), plain_desc({s.n, s.c})) << "N×C, flattened";
      EXPECT_TRUE(all_near(y.to_plain(), dst, tol));
      const Tensor& dx = pool.backward(make_tensor({s.n, s.c}, diff_dst));
      EXPECT_EQ(dx.desc(), x.desc());
      EXPECT_TRUE(all_near(dx.to_plain(), diff_src, tol));
      // A diff_dst in another 2-D layout (transposed) is reordered first.
      EXPECT_TRUE(all_near(pool.backward(make_tensor({s.n, s.c}, diff_dst, tag::ba)).to_plain(), diff_src, tol));
    }
  }
}

TEST(AdaptiveAvgPool2d, FollowsANewInputShape) {
  AdaptiveAvgPool2d pool("avgpool");
  const auto a = gradcheck::random_vector(2 * 5 * 3 * 3, 53);
  EXPECT_TRUE(all_near(pool.forward(make_tensor({2, 5, 3, 3}, a)).to_plain(),
                       reference::adaptive_avg_pool_forward(a, {2, 5, 3, 3}, 1, 1), tol));
  const auto b = gradcheck::random_vector(4 * 5 * 1 * 2, 54);
  EXPECT_TRUE(all_near(pool.forward(make_tensor({4, 5, 1, 2}, b, tag::nChw8c)).to_plain(),
                       reference::adaptive_avg_pool_forward(b, {4, 5, 1, 2}, 1, 1), tol));
  EXPECT_THROW(pool.forward(Tensor::plain({4, 5})), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
