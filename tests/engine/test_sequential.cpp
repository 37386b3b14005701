// Sequential: naming, chaining of setup / forward / backward, modes and propagate_down.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/layers/relu.h"
#include "engine/sequential.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;
using testing::make_tensor;

// conv(3→8, relu fused) → conv(8→6) → bn(6) → relu, named as torchvision names `features`.
void build(Sequential& seq) {
  auto& c0 = seq.emplace<Conv2d>(Conv2dOptions{.in = 3, .out = 8, .kernel = 3, .padding = 1, .relu = true});
  auto& c1 = seq.emplace<Conv2d>(Conv2dOptions{.in = 8, .out = 6, .kernel = 3, .stride = 2, .bias = false});
  seq.emplace<BatchNorm2d>(6);
  seq.emplace<ReLU>();
  c0.weight().value = gradcheck::random_vector(c0.weight().value.size(), 1, -0.5f, 0.5f);
  c0.bias()->value = gradcheck::random_vector(8, 2);
  c1.weight().value = gradcheck::random_vector(c1.weight().value.size(), 3, -0.5f, 0.5f);
}

TEST(Sequential, ChildrenAreNamedByPosition) {
  Sequential seq("features");
  build(seq);
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  seq.collect(params, buffers);
  std::vector<std::string> names;
  for (auto* p : params) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"features.0.weight", "features.0.bias", "features.1.weight",
                                             "features.2.weight", "features.2.bias"}));
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0]->name, "features.2.running_mean");
  EXPECT_EQ(seq[3].name(), "features.3");
  EXPECT_EQ(seq[3].type(), "ReLU");
  Sequential top("");
  EXPECT_EQ(top.next_name(), "0");
}

TEST(Sequential, ChainsLikeTheChildrenRunByHand) {
  Sequential seq("features");
  build(seq);
  Sequential by_hand("features");
  build(by_hand);
  const dims_t dims = {3, 3, 7, 13};
  const Tensor x = make_tensor(dims, gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 4));

  const dnnl::memory::desc out = seq.setup(x.desc());
  const Tensor& y = seq.forward(x);
  EXPECT_EQ(y.desc(), out);
  EXPECT_EQ(seq.setup_count(), 1) << "forward after setup with the same desc does not set up again";
  const Tensor* h = &x;
  for (std::size_t i = 0; i < by_hand.size(); ++i) h = &by_hand[i].forward(*h);
  EXPECT_EQ(y.to_plain(), h->to_plain());

  const Tensor dy = make_tensor(y.dims(), gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 5));
  const std::vector<float> dx = seq.backward(dy).to_plain();
  const Tensor* g = &dy;
  for (std::size_t i = by_hand.size(); i-- > 0;) g = &by_hand[i].backward(*g);
  EXPECT_EQ(dx, g->to_plain());
  std::vector<Param*> a, b;
  std::vector<Buffer*> unused;
  seq.collect(a, unused);
  by_hand.collect(b, unused);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]->grad, b[i]->grad) << a[i]->name;
}

TEST(Sequential, ModeAndPropagateDownReachTheRightChildren) {
  Sequential seq("features");
  build(seq);
  seq.set_mode(Mode::eval);
  for (std::size_t i = 0; i < seq.size(); ++i) EXPECT_EQ(seq[i].mode(), Mode::eval);
  auto& late = seq.emplace<ReLU>();
  EXPECT_EQ(late.mode(), Mode::eval) << "a child added later inherits the mode";
  seq.set_mode(Mode::train);

  seq.set_propagate_down(false);
  EXPECT_FALSE(seq[0].propagate_down());
  for (std::size_t i = 1; i < seq.size(); ++i) EXPECT_TRUE(seq[i].propagate_down());
  const dims_t dims = {2, 3, 7, 13};
  const Tensor& y = seq.forward(make_tensor(dims, gradcheck::random_vector(product(dims), 6)));
  const Tensor dy = make_tensor(y.dims(), gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 7));
  EXPECT_TRUE(seq.backward(dy).empty());
  auto& first = dynamic_cast<Conv2d&>(seq[0]);
  double norm = 0.0;
  for (float v : first.weight().grad) norm += std::abs(v);
  EXPECT_GT(norm, 0.0) << "the first layer still gets its weight gradients";
}

// The whole chain (blocked layouts between layers, fused and separate ReLUs, batch statistics) by central
// differences: composition keeps each layer's state intact between forward and backward.
TEST(Sequential, ChainGradientsMatchCentralDifferences) {
  Sequential seq("features");
  build(seq);
  auto& bn = dynamic_cast<BatchNorm2d&>(seq[2]);
  bn.weight().value = gradcheck::random_vector(6, 8, 0.5f, 1.5f);
  bn.bias().value = gradcheck::random_vector(6, 9, -0.5f, 0.5f);
  const dims_t dims = {3, 3, 7, 9};
  auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 10);
  const Tensor& y = seq.forward(make_tensor(dims, src));
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 11);
  const std::vector<float> dx = seq.backward(make_tensor(y.dims(), r)).to_plain();
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  seq.collect(params, buffers);
  auto loss = [&] { return gradcheck::weighted_sum(seq.forward(make_tensor(dims, src)).to_plain(), r); };
  gradcheck::Options options;
  options.step = 5e-3;  // float32 rounding, amplified by the normalization, swamps smaller steps
  options.max_points = 60;
  const auto data = gradcheck::check(src, dx, loss, options);
  EXPECT_TRUE(data.ok()) << "src: " << data.summary();
  for (Param* p : params) {
    const std::vector<float> analytic = p->grad;
    const auto report = gradcheck::check(p->value, analytic, loss, options);
    EXPECT_TRUE(report.ok()) << p->name << ": " << report.summary();
  }
}

// Records what a Sequential reports, as "+features.0 f" (begin, forward) and "-features.0 b" (end, backward).
class Recorder final : public ModuleObserver {
 public:
  void begin(const Module& child, Pass pass) override { events.push_back(text('+', child, pass)); }
  void end(const Module& child, Pass pass) override { events.push_back(text('-', child, pass)); }
  std::vector<std::string> events;

 private:
  static std::string text(char what, const Module& child, Pass pass) {
    std::string t(1, what);
    t += child.name();
    t += pass == Pass::forward ? " f" : " b";
    return t;
  }
};

TEST(Sequential, ObserverSeesEachChildAroundItsForwardAndBackwardWithoutChangingResults) {
  Sequential seq("features");
  build(seq);
  Sequential plain("features");
  build(plain);
  Recorder recorder;
  seq.set_observer(&recorder);
  const dims_t dims = {2, 3, 7, 9};
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 12);
  const Tensor& y = seq.forward(make_tensor(dims, src));
  const Tensor& y_plain = plain.forward(make_tensor(dims, src));
  EXPECT_EQ(y.to_plain(), y_plain.to_plain());
  EXPECT_EQ(recorder.events,
            (std::vector<std::string>{"+features.0 f", "-features.0 f", "+features.1 f", "-features.1 f",
                                      "+features.2 f", "-features.2 f", "+features.3 f", "-features.3 f"}));
  recorder.events.clear();
  const Tensor dy = make_tensor(y.dims(), gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 13));
  EXPECT_EQ(seq.backward(dy).to_plain(), plain.backward(dy).to_plain());
  EXPECT_EQ(recorder.events,
            (std::vector<std::string>{"+features.3 b", "-features.3 b", "+features.2 b", "-features.2 b",
                                      "+features.1 b", "-features.1 b", "+features.0 b", "-features.0 b"}));
  recorder.events.clear();
  seq.set_observer(nullptr);
  seq.forward(make_tensor(dims, src));
  EXPECT_TRUE(recorder.events.empty());
}

TEST(Sequential, BackwardBeforeForwardIsAnError) {
  Sequential seq("features");
  build(seq);
  EXPECT_THROW(seq.backward(Tensor::plain({1, 6, 3, 6})), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
