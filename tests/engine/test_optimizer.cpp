// Optimizers against updates worked out by hand from their formulas, state round trips and the registry.
#include "engine/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::engine {
namespace {

// Hand-computed expectations are written in decimal; float storage costs a few ulps.
constexpr double tolerance = 1e-6;

Param make_param(const std::string& name, ParamKind kind, std::vector<float> value) {
  Param p;
  p.name = name;
  p.kind = kind;
  p.shape = {static_cast<std::int64_t>(value.size())};
  p.value = std::move(value);
  p.grad.assign(p.value.size(), 0.0f);
  return p;
}

// Runs one step per entry of `grads` on a one-element parameter starting at `w0`; returns w after each step.
std::vector<double> trajectory(Optimizer& optimizer, ParamKind kind, float w0, const std::vector<float>& grads,
                               double lr) {
  Param p = make_param("p", kind, {w0});
  std::vector<Param*> params{&p};
  std::vector<double> out;
  for (float g : grads) {
    p.grad[0] = g;
    optimizer.step(params, lr);
    out.push_back(p.value[0]);
  }
  return out;
}

void expect_values(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_NEAR(actual[i], expected[i], tolerance) << "step " << i + 1;
}

OptimizerOptions options(double momentum, bool nesterov, double weight_decay) {
  OptimizerOptions o;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.weight_decay = weight_decay;
  return o;
}

// Grads of the three-step SGD cases: w0 = 1, lr = 0.1.
const std::vector<float> three_grads = {0.5f, -0.2f, 0.1f};

// ---- SGD ----

TEST(Sgd, PlainStepIsRateTimesGradient) {
  Sgd sgd(options(0.0, false, 0.0));
  // w = 1 − 0.1·0.5 = 0.95;  0.95 + 0.1·0.2 = 0.97;  0.97 − 0.1·0.1 = 0.96
  expect_values(trajectory(sgd, ParamKind::conv_weight, 1.0f, three_grads, 0.1), {0.95, 0.97, 0.96});
  EXPECT_TRUE(sgd.state().empty()) << "no momentum, no buffer";
}

TEST(Sgd, MomentumBufferStartsAtTheFirstGradient) {
  Sgd sgd(options(0.9, false, 0.0));
  // buf = 0.5              w = 1 − 0.05 = 0.95
  // buf = 0.45 − 0.2 = 0.25   w = 0.95 − 0.025 = 0.925
  // buf = 0.225 + 0.1 = 0.325 w = 0.925 − 0.0325 = 0.8925
  expect_values(trajectory(sgd, ParamKind::conv_weight, 1.0f, three_grads, 0.1), {0.95, 0.925, 0.8925});
  ASSERT_EQ(sgd.state().count("momentum_buffer/p"), 1u);
  EXPECT_NEAR(sgd.state().at("momentum_buffer/p")[0], 0.325, tolerance);
}

TEST(Sgd, NesterovLooksAhead) {
  Sgd sgd(options(0.9, true, 0.0));
  // buf = 0.5,   d = 0.5 + 0.9·0.5 = 0.95       w = 1 − 0.095 = 0.905
  // buf = 0.25,  d = −0.2 + 0.9·0.25 = 0.025     w = 0.905 − 0.0025 = 0.9025
  // buf = 0.325, d = 0.1 + 0.9·0.325 = 0.3925    w = 0.9025 − 0.03925 = 0.86325
  expect_values(trajectory(sgd, ParamKind::conv_weight, 1.0f, three_grads, 0.1), {0.905, 0.9025, 0.86325});
}

TEST(Sgd, WeightDecayIsAddedToTheGradientBeforeMomentum) {
  Sgd sgd(options(0.9, false, 0.01));
  // d = 0.5 + 0.01·1 = 0.51;             buf = 0.51;                        w = 1 − 0.051 = 0.949
  // d = −0.2 + 0.01·0.949 = −0.19051;    buf = 0.459 − 0.19051 = 0.26849;   w = 0.949 − 0.026849 = 0.922151
  // d = 0.1 + 0.00922151 = 0.10922151;   buf = 0.241641 + 0.10922151 = 0.35086251;
  //                                                                         w = 0.922151 − 0.035086251 = 0.887064749
  expect_values(trajectory(sgd, ParamKind::linear_weight, 1.0f, three_grads, 0.1), {0.949, 0.922151, 0.887064749});
}

TEST(Sgd, PlainStepWithDecayButNoMomentum) {
  Sgd sgd(options(0.0, false, 0.5));
  // w = 1 − 0.1·(0.5 + 0.5·1) = 0.9;  w = 0.9 − 0.1·(−0.2 + 0.45) = 0.875
  expect_values(trajectory(sgd, ParamKind::conv_weight, 1.0f, {0.5f, -0.2f}, 0.1), {0.9, 0.875});
}

TEST(Sgd, BiasesAndNormParametersAreNotDecayed) {
  for (ParamKind kind : {ParamKind::bias, ParamKind::norm_weight, ParamKind::norm_bias}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Sgd sgd(options(0.9, false, 0.01));
    // The plain-momentum numbers of MomentumBufferStartsAtTheFirstGradient, untouched by the 0.01 decay.
    expect_values(trajectory(sgd, kind, 1.0f, three_grads, 0.1), {0.95, 0.925, 0.8925});
  }
}

TEST(Sgd, ParametersAreIndependent) {
  // Two parameters in one step, each with its own buffer: the second is the first scaled by −2.
  Sgd sgd(options(0.9, true, 0.0));
  Param a = make_param("a", ParamKind::conv_weight, {1.0f, 2.0f});
  Param b = make_param("b", ParamKind::conv_weight, {-2.0f, -4.0f});
  std::vector<Param*> params{&a, &b};
  for (float g : three_grads) {
    a.grad = {g, 2 * g};
    b.grad = {-2 * g, -4 * g};
    sgd.step(params, 0.1);
  }
  EXPECT_NEAR(a.value[0], 0.86325, tolerance);
  EXPECT_NEAR(a.value[1], 2.0 - 2 * (1.0 - 0.86325), tolerance);
  EXPECT_NEAR(b.value[0], -2.0 + 2 * (1.0 - 0.86325), tolerance);
  EXPECT_NEAR(b.value[1], -4.0 + 4 * (1.0 - 0.86325), tolerance);
  EXPECT_EQ(sgd.state().size(), 2u);
}

// The parallel, vectorised path (more elements than a parallel region is worth) against a naive loop.
TEST(Sgd, LargeParameterMatchesNaiveLoop) {
  constexpr std::size_t n = 100'003;  // odd, not a multiple of any block or vector width
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Param p = make_param("w", ParamKind::conv_weight, std::vector<float>(n));
  for (auto& x : p.value) x = normal(rng);
  std::vector<float> w = p.value, buf(n);
  Sgd sgd(options(0.9, true, 1e-4));
  std::vector<Param*> params{&p};
  for (int step = 0; step < 3; ++step) {
    for (auto& x : p.grad) x = normal(rng);
    sgd.step(params, 0.05);
    for (std::size_t i = 0; i < n; ++i) {
      const float d = p.grad[i] + 1e-4f * w[i];
      buf[i] = step == 0 ? d : 0.9f * buf[i] + d;
      w[i] -= 0.05f * (d + 0.9f * buf[i]);
    }
  }
  for (std::size_t i = 0; i < n; i += 997) EXPECT_NEAR(p.value[i], w[i], 1e-5 * (1 + std::abs(w[i]))) << i;
}

TEST(Sgd, NesterovWithoutMomentumIsAConfigError) {
  try {
    Sgd sgd(options(0.0, true, 0.0));
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "optimizer.nesterov");
  }
  EXPECT_THROW(Sgd(options(1.5, false, 0.0)), core::ConfigError);
  EXPECT_THROW(Sgd(options(0.9, false, -1.0)), core::ConfigError);
}

// ---- LARS ----

OptimizerOptions lars_options(double momentum) {
  OptimizerOptions o = options(momentum, false, 0.2);
  o.trust_coefficient = 0.02;
  o.epsilon = 0.0;
  return o;
}

// w0 = (3, 4): ‖w‖ = 5; g1 = (0.6, 0.8): ‖g‖ = 1; lr = 2, η = 0.02, wd = 0.2, ε = 0.
//   step 1: λ = 0.02·5 / (1 + 0.2·5) = 0.05, γλ = 0.1;  d = g + 0.2w = (1.2, 1.6);  v = (0.12, 0.16)
//           w1 = (2.88, 3.84): ‖w1‖ = 4.8
//   step 2: g2 = 0.54·(0.6, −0.8) = (0.324, −0.432): ‖g2‖ = 0.54
//           λ = 0.02·4.8 / (0.54 + 0.2·4.8) = 0.096 / 1.5 = 0.064, γλ = 0.128
//           d = (0.324 + 0.576, −0.432 + 0.768) = (0.9, 0.336)
struct LarsCase {
  Param p = make_param("layer1.0.conv1.weight", ParamKind::conv_weight, {3.0f, 4.0f});
  std::vector<Param*> params{&p};
  void step(Optimizer& optimizer, int index) {
    p.grad = index == 1 ? std::vector<float>{0.6f, 0.8f} : std::vector<float>{0.324f, -0.432f};
    optimizer.step(params, 2.0);
  }
};

TEST(Lars, LocalRateScalesTheMomentumUpdate) {
  Lars lars(lars_options(0.9));
  LarsCase c;
  c.p.grad = {0.6f, 0.8f};
  EXPECT_NEAR(lars.local_rate(c.p), 0.05, 1e-9);
  c.step(lars, 1);
  EXPECT_NEAR(c.p.value[0], 2.88, tolerance);
  EXPECT_NEAR(c.p.value[1], 3.84, tolerance);
  c.p.grad = {0.324f, -0.432f};
  EXPECT_NEAR(lars.local_rate(c.p), 0.064, 1e-7);
  c.step(lars, 2);
  // v = 0.9·(0.12, 0.16) + 0.128·(0.9, 0.336) = (0.2232, 0.187008);  w2 = (2.6568, 3.652992)
  EXPECT_NEAR(c.p.value[0], 2.6568, tolerance);
  EXPECT_NEAR(c.p.value[1], 3.652992, tolerance);
  const auto& v = lars.state().at("momentum_buffer/layer1.0.conv1.weight");
  EXPECT_NEAR(v[0], 0.2232, tolerance);
  EXPECT_NEAR(v[1], 0.187008, tolerance);
}

TEST(Lars, WithoutMomentum) {
  Lars lars(lars_options(0.0));
  LarsCase c;
  c.step(lars, 1);
  c.step(lars, 2);
  // w2 = w1 − 0.128·(0.9, 0.336) = (2.88 − 0.1152, 3.84 − 0.043008)
  EXPECT_NEAR(c.p.value[0], 2.7648, tolerance);
  EXPECT_NEAR(c.p.value[1], 3.796992, tolerance);
  EXPECT_TRUE(lars.state().empty());
}

TEST(Lars, BiasesAndNormParametersTakeThePlainRateWithoutDecay) {
  for (ParamKind kind : {ParamKind::bias, ParamKind::norm_weight, ParamKind::norm_bias}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Lars lars(lars_options(0.9));
    Param p = make_param("bn1.weight", kind, {3.0f, 4.0f});
    std::vector<Param*> params{&p};
    p.grad = {0.6f, 0.8f};
    // v = 2·(0.6, 0.8) = (1.2, 1.6), w = (1.8, 2.4); then v = 0.9·v + 2·g = (2.28, 3.04), w = (−0.48, −0.64)
    lars.step(params, 2.0);
    EXPECT_NEAR(p.value[0], 1.8, tolerance);
    EXPECT_NEAR(p.value[1], 2.4, tolerance);
    lars.step(params, 2.0);
    EXPECT_NEAR(p.value[0], -0.48, tolerance);
    EXPECT_NEAR(p.value[1], -0.64, tolerance);
  }
}

TEST(Lars, ZeroWeightOrGradientStaysFinite) {
  OptimizerOptions o = lars_options(0.9);  // ε = 0: the worst case for a 0/0
  {
    Lars lars(o);
    Param p = make_param("zero_init.weight", ParamKind::conv_weight, {0.0f, 0.0f});
    p.grad = {0.5f, -1.0f};
    std::vector<Param*> params{&p};
    lars.step(params, 0.1);
    // λ = 1 for an all-zero weight: the plain step −0.1·g, so a zero-initialised layer still learns.
    EXPECT_NEAR(p.value[0], -0.05, tolerance);
    EXPECT_NEAR(p.value[1], 0.1, tolerance);
  }
  {
    Lars lars(o);
    Param p = make_param("frozen.weight", ParamKind::conv_weight, {3.0f, 4.0f});
    std::vector<Param*> params{&p};
    lars.step(params, 0.1);
    // λ = 1 without a gradient: only the decay, w − 0.1·0.2·w = 0.98·w
    EXPECT_NEAR(p.value[0], 2.94, tolerance);
    EXPECT_NEAR(p.value[1], 3.92, tolerance);
  }
  {
    Lars lars(o);
    Param p = make_param("nothing.weight", ParamKind::conv_weight, {0.0f, 0.0f});
    std::vector<Param*> params{&p};
    lars.step(params, 0.1);
    EXPECT_EQ(p.value[0], 0.0f);
    EXPECT_EQ(p.value[1], 0.0f);
    for (float x : lars.state().at("momentum_buffer/nothing.weight")) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(Lars, LocalRateOfALargeParameterMatchesDoubleSums) {
  constexpr std::size_t n = 70'001;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Param p = make_param("fc.weight", ParamKind::linear_weight, std::vector<float>(n));
  double ww = 0.0, gg = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    p.value[i] = uniform(rng);
    p.grad[i] = 0.01f * uniform(rng);
    ww += static_cast<double>(p.value[i]) * p.value[i];
    gg += static_cast<double>(p.grad[i]) * p.grad[i];
  }
  OptimizerOptions o = lars_options(0.9);
  o.epsilon = 1e-9;
  Lars lars(o);
  const double expected = 0.02 * std::sqrt(ww) / (std::sqrt(gg) + 0.2 * std::sqrt(ww) + 1e-9);
  EXPECT_NEAR(lars.local_rate(p), expected, 1e-12 * expected);
}

TEST(Lars, NesterovIsAConfigError) {
  OptimizerOptions o = lars_options(0.9);
  o.nesterov = true;
  EXPECT_THROW(Lars{o}, core::ConfigError);
  o.nesterov = false;
  o.trust_coefficient = 0.0;
  EXPECT_THROW(Lars{o}, core::ConfigError);
}

// ---- common behaviour ----

TEST(Optimizer, ZeroGradClearsAndSizesGradients) {
  Param a = make_param("a", ParamKind::conv_weight, {1.0f, 2.0f, 3.0f});
  a.grad = {4.0f, 5.0f, 6.0f};
  Param b = make_param("b", ParamKind::bias, {1.0f});
  b.grad.clear();
  Optimizer::zero_grad({&a, &b});
  EXPECT_EQ(a.grad, std::vector<float>(3, 0.0f));
  EXPECT_EQ(b.grad, std::vector<float>(1, 0.0f));
}

TEST(Optimizer, StepRejectsMismatchedGradientsAndBadRates) {
  Sgd sgd(options(0.9, false, 0.0));
  Param p = make_param("layer1.0.conv1.weight", ParamKind::conv_weight, {1.0f, 2.0f});
  p.grad.resize(1);
  try {
    sgd.step({&p}, 0.1);
    FAIL() << "expected an InternalError";
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("layer1.0.conv1.weight"), std::string::npos) << e.what();
  }
  p.grad.resize(2);
  EXPECT_THROW(sgd.step({&p}, -0.1), core::InternalError);
  EXPECT_THROW(sgd.step({&p}, std::nan("")), core::InternalError);
  EXPECT_EQ(p.value, (std::vector<float>{1.0f, 2.0f})) << "a rejected step changes nothing";
}

// A small model: two weights, a bias and a BN pair; deterministic gradients that change every step.
struct Model {
  Param conv = make_param("conv1.weight", ParamKind::conv_weight, {0.3f, -0.7f, 1.1f, 0.2f, -0.5f});
  Param bias = make_param("conv1.bias", ParamKind::bias, {0.1f, -0.1f, 0.05f});
  Param gamma = make_param("bn1.weight", ParamKind::norm_weight, {1.0f, 1.0f});
  Param beta = make_param("bn1.bias", ParamKind::norm_bias, {0.0f, 0.0f});
  Param fc = make_param("fc.weight", ParamKind::linear_weight, {0.25f, -0.125f, 0.5f, 0.75f});
  std::vector<Param*> params{&conv, &bias, &gamma, &beta, &fc};

  void set_grads(int step) {
    for (Param* p : params) {
      for (std::size_t i = 0; i < p->grad.size(); ++i) {
        p->grad[i] = std::sin(0.7f * static_cast<float>(step) + 1.3f * static_cast<float>(i) + p->value[i]);
      }
    }
  }
  void train(Optimizer& optimizer, int from, int to) {
    for (int step = from; step < to; ++step) {
      set_grads(step);
      optimizer.step(params, 0.05 / (1 + step));  // a changing rate, as under a schedule
    }
  }
};

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, ExportedStateContinuesBitForBit) {
  OptimizerOptions o = options(0.9, GetParam() == "sgd", 1e-2);
  Model straight;
  auto uninterrupted = make_optimizer(GetParam(), o);
  straight.train(*uninterrupted, 0, 6);

  Model resumed;
  OptimizerState saved;
  {
    auto first = make_optimizer(GetParam(), o);
    resumed.train(*first, 0, 3);
    saved = first->state();  // what a checkpoint stores
  }
  ASSERT_EQ(saved.size(), resumed.params.size()) << "one momentum buffer per parameter";
  auto second = make_optimizer(GetParam(), o);
  second->load_state(saved, resumed.params, "ckpt.h5");
  resumed.train(*second, 3, 6);

  for (std::size_t k = 0; k < straight.params.size(); ++k) {
    EXPECT_EQ(straight.params[k]->value, resumed.params[k]->value) << straight.params[k]->name;
  }
  EXPECT_EQ(uninterrupted->state(), second->state());

  // Without the state the run differs: the test can tell a lost buffer.
  Model restarted;
  auto fresh = make_optimizer(GetParam(), o);
  restarted.train(*fresh, 0, 3);
  auto forgetful = make_optimizer(GetParam(), o);
  restarted.train(*forgetful, 3, 6);
  EXPECT_NE(straight.conv.value, restarted.conv.value);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Resume, ::testing::Values("sgd", "lars"));

core::InputError load_error(const OptimizerState& state, const std::vector<Param*>& params) {
  Sgd sgd(options(0.9, false, 0.0));
  try {
    sgd.load_state(state, params, "ckpt.h5");
  } catch (const core::InputError& e) {
    EXPECT_TRUE(sgd.state().empty()) << "a rejected state is not half-loaded";
    return e;
  }
  ADD_FAILURE() << "expected an InputError";
  return core::InputError("", "");
}

TEST(Optimizer, LoadStateRejectsMismatchedCheckpoints) {
  Param a = make_param("a.weight", ParamKind::conv_weight, {1.0f, 2.0f});
  Param b = make_param("b.bias", ParamKind::bias, {1.0f});
  const std::vector<Param*> params{&a, &b};
  const OptimizerState good = {{"momentum_buffer/a.weight", {0.1f, 0.2f}}, {"momentum_buffer/b.bias", {0.3f}}};
  {
    Sgd sgd(options(0.9, false, 0.0));
    sgd.load_state(good, params, "ckpt.h5");
    EXPECT_EQ(sgd.state(), good);
  }
  struct Case {
    OptimizerState state;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{{"momentum_buffer/a.weight", {0.1f}}, {"momentum_buffer/b.bias", {0.3f}}}, "has 1 values"},
      {{{"momentum_buffer/a.weight", {0.1f, 0.2f}}, {"momentum_buffer/c.weight", {0.3f}}}, "names no parameter"},
      {{{"exp_avg/a.weight", {0.1f, 0.2f}}}, "unknown slot 'exp_avg'"},
      {{{"momentum_buffer/a.weight", {0.1f, 0.2f}}}, "missing for parameter 'b.bias'"},
      {{{"a.weight", {0.1f, 0.2f}}}, "not '<slot>/<parameter>'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const core::InputError e = load_error(c.state, params);
    EXPECT_EQ(e.file(), "ckpt.h5");
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
  }
}

// ---- registry ----

TEST(OptimizerRegistry, ListsSgdAndLars) {
  EXPECT_EQ(optimizer_names(), (std::vector<std::string>{"sgd", "lars"}));
  for (const auto& entry : optimizer_registry()) {
    EXPECT_EQ(make_optimizer(entry.name, OptimizerOptions{})->name(), std::string(entry.name));
  }
}

TEST(OptimizerRegistry, UnknownNameListsTheKnownOnes) {
  try {
    make_optimizer("adam", OptimizerOptions{});
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "optimizer.name");
    EXPECT_NE(std::string(e.what()).find("unknown optimizer 'adam' (known: sgd, lars)"), std::string::npos) << e.what();
  }
  try {
    make_optimizer("lras", OptimizerOptions{});
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'lars'?"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::engine
