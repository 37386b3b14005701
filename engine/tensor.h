// An activation tensor: float32, N×C×H×W (4-D) or N×C (2-D), held in a dnnl::memory in whatever layout the
// primitive that produced it chose (plain nchw, or blocked such as nChw8c where channels are split into blocks
// of 8 and padded with zeros). Layers pass tensors on in that layout; only the model's edges (the input batch,
// the logits) and consumers that need another layout reorder.
//
// A Tensor is a shared handle: copying it shares the buffer (like dnnl::memory itself). A module's forward()
// returns its own output tensor, which stays valid and unchanged until that module's next forward; whoever
// keeps a copy for backward (a layer keeps its src) relies on exactly that.
//
// dims() are always the logical PyTorch dims (N, C, H, W), whatever the layout; to_plain()/from_plain() speak
// PyTorch's NCHW (or NC) element order.
//
// Reduced-precision inference (engine/precision.h) also passes bfloat16 tensors and, in int8, quantized ones: u8
// or s8 values with one scale per tensor, real value = scale() × stored value (oneDNN's model with zero point 0).
// The scale travels with the handle; a float tensor's scale is 1. A Reorderer into a float desc dequantizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace tessera::engine {

using dims_t = dnnl::memory::dims;

// The plain (PyTorch-order) layout for a number of dimensions: x, nc, ncw, nchw, ncdhw.
dnnl::memory::format_tag plain_tag(int ndims);
// A float32 desc with the plain layout for `dims`.
dnnl::memory::desc plain_desc(const dims_t& dims);
// True when `desc` is the plain dense layout of its dims.
bool is_plain(const dnnl::memory::desc& desc);
// True for u8, s8 and s32: a quantized tensor's data types.
bool is_integer(dnnl::memory::data_type type);
// `desc` with another data type and the same dims and layout (activations only: no extra flags).
dnnl::memory::desc with_data_type(const dnnl::memory::desc& desc, dnnl::memory::data_type type);
// Product of the dims (logical elements, not counting blocked-layout padding).
std::int64_t product(const dims_t& dims);

class Tensor {
 public:
  // An empty tensor (no memory); empty() is true.
  Tensor() = default;
  // Allocates a zeroed tensor with this desc (zeroed so padded blocks are zero, as oneDNN requires).
  explicit Tensor(const dnnl::memory::desc& desc);
  // Wraps an existing memory (shares it).
  explicit Tensor(dnnl::memory memory);

  // A zeroed tensor in the plain layout (nchw for 4 dims, nc for 2).
  static Tensor plain(const dims_t& dims);

  bool empty() const { return !memory_; }
  const dnnl::memory::desc& desc() const { return desc_; }
  dims_t dims() const { return desc_.dims(); }
  std::int64_t numel() const { return product(desc_.dims()); }
  const dnnl::memory& memory() const { return memory_; }
  // The raw buffer, in the tensor's layout (for plain tensors: NCHW order).
  float* data() const { return static_cast<float*>(memory_.get_data_handle()); }
  dnnl::memory::data_type data_type() const { return desc_.data_type(); }
  // Quantized tensors: real value = scale() × stored value. 1 for float tensors.
  float scale() const { return scale_; }
  void set_scale(float scale) { scale_ = scale; }

  // The elements in NCHW (NC) order; reorders from a blocked layout.
  std::vector<float> to_plain() const;
  // Fills the tensor from NCHW-ordered values (size must be numel()); reorders into the tensor's layout.
  // Throws InternalError on a size mismatch.
  void from_plain(const std::vector<float>& values);
  // This tensor in layout `desc` (same dims): *this itself (shared) when the layout already matches,
  // otherwise a new tensor holding a reorder. For repeated reorders in a layer use Reorderer instead.
  Tensor reordered_to(const dnnl::memory::desc& desc) const;

 private:
  dnnl::memory::desc desc_;
  dnnl::memory memory_;
  float scale_ = 1.0f;
};

// The smallest and largest value of the float32 tensors seen: int8 calibration (engine/precision.h) watches
// activations with it. The zero padding of a blocked layout counts as a value (it only ever widens the range to 0).
struct ValueRange {
  float min = 0.0f;
  float max = 0.0f;
  bool seen = false;

  void include(const Tensor& tensor);  // InternalError for a tensor that is not float32
  float abs_max() const { return std::max(-min, max); }
};

// Brings tensors into a wanted layout repeatedly without creating a primitive or a buffer per call: the reorder
// primitive and the destination tensor are kept and rebuilt only when the source or wanted desc changes.
// Layers use it for inputs whose layout differs from the one their primitive chose (e.g. the network's nchw
// input batch before a convolution that runs in nChw8c, or a diff_dst in another blocked layout).
class Reorderer {
 public:
  // `src` itself when its desc equals `want` (and its scale `want_scale`); otherwise the reordered copy (owned
  // here, valid until the next call). Values are rescaled by src.scale() / want_scale on the way: an integer src
  // into a float desc is dequantized, a float src into an integer desc quantized with scale `want_scale` (which
  // must then be given; it is 1 for float descs), an integer one requantized.
  const Tensor& operator()(const Tensor& src, const dnnl::memory::desc& want, float want_scale = 1.0f);

 private:
  dnnl::memory::desc src_desc_;
  float factor_ = 1.0f;
  dnnl::reorder reorder_;
  Tensor dst_;
};

// Reorders `src` into `dst` and adds it to what `dst` holds: dst += reorder(src). One pass, used to accumulate
// gradients computed in a primitive's layout into a plain Param::grad. Keeps the primitive for the last pair of
// descs it saw.
class AccumulatingReorder {
 public:
  void operator()(const dnnl::memory& src, const dnnl::memory& dst);

 private:
  dnnl::memory::desc src_desc_;
  dnnl::memory::desc dst_desc_;
  dnnl::reorder reorder_;
};

// Wraps a plain float vector (e.g. Param::value or Param::grad) as a dnnl::memory with `dims`, without copying.
// The memory is valid while the vector is not resized.
dnnl::memory wrap_plain(std::vector<float>& values, const dims_t& dims);

}  // namespace tessera::engine
