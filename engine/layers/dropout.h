// Dropout (torch.nn.Dropout): in training, each element is kept with probability 1 − p and scaled so the
// expectation is unchanged; in eval it is the identity.
//
//   train:  dst = src · m / (1 − p),   m ∈ {0, 1}, P(m = 0) = p       diff_src = diff_dst · m / (1 − p)
//   eval:   dst = src (the same buffer, no copy)                       diff_src = diff_dst
//   any shape and layout; dst and diff_src are in src's layout; dst in src's data type, diff_src in float32 (a
//   bfloat16 src, in bf16 training, is masked in float32 and the result converted back).
//
// The mask comes from a counter-based generator: element i of the k-th training forward since seed() is kept
// when hash(seed, k, i) ≥ p·2³². It depends on nothing else — not the thread count, not the order of the
// work — so the same seed gives the same masks, bit for bit, on every run. i counts the elements of src's
// buffer in its layout (blocked padding included, where src is zero anyway).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/module.h"
#include "engine/tensor.h"

namespace tessera::engine {

class Dropout : public Module {
 public:
  // p in [0, 1): the probability of dropping an element.
  Dropout(std::string name, float p = 0.5f, std::uint64_t seed = 0);
  std::string type() const override { return "Dropout"; }

  float p() const { return p_; }
  // Restarts the mask sequence (e.g. a different seed per rank, or the same one to replay a run).
  void seed(std::uint64_t seed);

  // The keep mask of the last training forward, one byte per element of src's buffer in its layout.
  const std::vector<std::uint8_t>& mask() const { return keep_; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  float p_;
  std::uint64_t seed_ = 0;
  std::uint64_t step_ = 0;  // training forwards since seed()
  bool masked_ = false;     // the last forward applied a mask (training with p > 0)
  std::vector<std::uint8_t> keep_;
  Tensor values_;  // the masked values, float32 in src's layout (dst itself for a float32 src)
  Tensor diff_src_;
  Tensor identity_;        // src itself (shared handle) when no mask applies
  Tensor identity_diff_;   // diff_dst itself when no mask applies
  Reorderer src_reorder_;  // src → float32 (itself when it is)
  Reorderer dst_reorder_;  // values_ → src's data type (itself when float32)
  Reorderer diff_dst_reorder_;
};

}  // namespace tessera::engine
