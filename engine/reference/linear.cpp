#include "engine/reference/linear.h"

#include <cstddef>
#include <string>

#include "core/error.h"

namespace tessera::engine::reference {
namespace {

void check_size(const std::vector<float>& v, int expected, const char* what) {
  if (v.size() != static_cast<std::size_t>(expected)) {
    throw core::InternalError(std::string("reference linear: ") + what + " has " + std::to_string(v.size()) +
                              " values, expected " + std::to_string(expected));
  }
}

}  // namespace

std::vector<float> linear_forward(const std::vector<float>& x, const std::vector<float>& weight,
                                  const std::vector<float>& bias, const LinearShape& s) {
  check_size(x, s.batch * s.inputs, "x");
  check_size(weight, s.outputs * s.inputs, "weight");
  if (!bias.empty()) check_size(bias, s.outputs, "bias");
  std::vector<float> y(static_cast<std::size_t>(s.batch) * s.outputs);
  for (int n = 0; n < s.batch; ++n) {
    for (int o = 0; o < s.outputs; ++o) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < s.inputs; ++i) sum += static_cast<double>(x[n * s.inputs + i]) * weight[o * s.inputs + i];
      y[n * s.outputs + o] = static_cast<float>(sum);
    }
  }
  return y;
}

LinearGrads linear_backward(const std::vector<float>& x, const std::vector<float>& weight,
                            const std::vector<float>& diff_y, const LinearShape& s) {
  check_size(x, s.batch * s.inputs, "x");
  check_size(weight, s.outputs * s.inputs, "weight");
  check_size(diff_y, s.batch * s.outputs, "diff_y");
  LinearGrads g;
  g.diff_x.assign(x.size(), 0.0f);
  g.diff_weight.assign(weight.size(), 0.0f);
  g.diff_bias.assign(static_cast<std::size_t>(s.outputs), 0.0f);
  for (int n = 0; n < s.batch; ++n) {
    for (int i = 0; i < s.inputs; ++i) {
      double sum = 0.0;
      for (int o = 0; o < s.outputs; ++o)
        sum += static_cast<double>(diff_y[n * s.outputs + o]) * weight[o * s.inputs + i];
      g.diff_x[n * s.inputs + i] = static_cast<float>(sum);
    }
  }
  for (int o = 0; o < s.outputs; ++o) {
    for (int i = 0; i < s.inputs; ++i) {
      double sum = 0.0;
      for (int n = 0; n < s.batch; ++n) sum += static_cast<double>(diff_y[n * s.outputs + o]) * x[n * s.inputs + i];
      g.diff_weight[o * s.inputs + i] = static_cast<float>(sum);
    }
    double sum = 0.0;
    for (int n = 0; n < s.batch; ++n) sum += diff_y[n * s.outputs + o];
    g.diff_bias[o] = static_cast<float>(sum);
  }
  return g;
}

}  // namespace tessera::engine::reference
