#include "engine/tensor.h"

#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

dnnl::memory::format_tag plain_tag(int ndims) {
  switch (ndims) {
    case 1:
      return dnnl::memory::format_tag::a;
    case 2:
      return dnnl::memory::format_tag::ab;
    case 3:
      return dnnl::memory::format_tag::abc;
    case 4:
      return dnnl::memory::format_tag::abcd;
    case 5:
      return dnnl::memory::format_tag::abcde;
    default:
      throw core::InternalError("tensor: no plain layout for " + std::to_string(ndims) + " dimensions");
  }
}

dnnl::memory::desc plain_desc(const dims_t& dims) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, plain_tag(static_cast<int>(dims.size())));
}

bool is_plain(const dnnl::memory::desc& desc) { return desc == plain_desc(desc.dims()); }

bool is_integer(dnnl::memory::data_type type) {
  using dt = dnnl::memory::data_type;
  return type == dt::u8 || type == dt::s8 || type == dt::s32;
}

dnnl::memory::desc with_data_type(const dnnl::memory::desc& desc, dnnl::memory::data_type type) {
  dnnl::memory::desc result = desc;
  result.data.data_type = dnnl::memory::convert_to_c(type);
  return result;
}

std::int64_t product(const dims_t& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

namespace {

std::string dims_text(const dims_t& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
  return s;
}

void execute_reorder(const dnnl::reorder& r, const dnnl::memory& src, const dnnl::memory& dst) {
  r.execute(Context::get().stream(), {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
}

void run_reorder(const dnnl::memory& src, const dnnl::memory& dst) {
  execute_reorder(dnnl::reorder(src, dst), src, dst);
}

}  // namespace

Tensor::Tensor(const dnnl::memory::desc& desc) : desc_(desc), memory_(desc, Context::get().engine()) {
  if (desc.get_size() > 0) std::memset(memory_.get_data_handle(), 0, desc.get_size());
}

Tensor::Tensor(dnnl::memory mem) : desc_(mem.get_desc()), memory_(std::move(mem)) {}

Tensor Tensor::plain(const dims_t& dims) { return Tensor(plain_desc(dims)); }

std::vector<float> Tensor::to_plain() const {
  if (empty()) return {};
  std::vector<float> values(static_cast<std::size_t>(numel()));
  if (values.empty()) return values;
  if (is_plain(desc_)) {
    std::memcpy(values.data(), data(), values.size() * sizeof(float));
    return values;
  }
  dnnl::memory dst(plain_desc(desc_.dims()), Context::get().engine(), values.data());
  run_reorder(memory_, dst);
  if (scale_ != 1.0f) {
    for (float& v : values) v *= scale_;
  }
  return values;
}

void Tensor::from_plain(const std::vector<float>& values) {
  if (empty() || static_cast<std::int64_t>(values.size()) != numel()) {
    throw core::InternalError("tensor from_plain: " + std::to_string(values.size()) + " values for a tensor of " +
                              dims_text(desc_.dims()));
  }
  if (values.empty()) return;
  if (is_plain(desc_)) {
    std::memcpy(data(), values.data(), values.size() * sizeof(float));
    return;
  }
  dnnl::memory src(plain_desc(desc_.dims()), Context::get().engine(), const_cast<float*>(values.data()));
  run_reorder(src, memory_);
}

Tensor Tensor::reordered_to(const dnnl::memory::desc& desc) const {
  if (desc == desc_) return *this;
  if (desc.dims() != desc_.dims()) {
    throw core::InternalError("tensor reorder: dims " + dims_text(desc_.dims()) + " cannot become " +
                              dims_text(desc.dims()));
  }
  Tensor result(desc);
  run_reorder(memory_, result.memory_);
  return result;
}

const Tensor& Reorderer::operator()(const Tensor& src, const dnnl::memory::desc& want, float want_scale) {
  const float factor = src.scale() / want_scale;
  if (src.desc() == want && factor == 1.0f) return src;
  if (dst_.empty() || dst_.desc() != want || src_desc_ != src.desc() || factor_ != factor) {
    if (src.dims() != want.dims()) {
      throw core::InternalError("tensor reorder: dims " + dims_text(src.dims()) + " cannot become " +
                                dims_text(want.dims()));
    }
    dnnl::primitive_attr attr;
    if (factor != 1.0f) attr.set_output_scales(0, {factor});
    reorder_ = dnnl::reorder(
        dnnl::reorder::primitive_desc(Context::get().engine(), src.desc(), Context::get().engine(), want, attr));
    src_desc_ = src.desc();
    factor_ = factor;
    if (dst_.empty() || dst_.desc() != want) dst_ = Tensor(want);
  }
  execute_reorder(reorder_, src.memory(), dst_.memory());
  dst_.set_scale(is_integer(want.data_type()) ? want_scale : 1.0f);
  return dst_;
}

void ValueRange::include(const Tensor& tensor) {
  if (tensor.empty()) return;
  if (tensor.data_type() != dnnl::memory::data_type::f32) {
    throw core::InternalError("value range: only float32 tensors are observed");
  }
  const auto count = static_cast<std::int64_t>(tensor.desc().get_size() / sizeof(float));
  if (count == 0) return;
  const float* x = tensor.data();
  float lo = seen ? min : x[0], hi = seen ? max : x[0];
#pragma omp parallel for reduction(min : lo) reduction(max : hi) schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  min = lo;
  max = hi;
  seen = true;
}

void AccumulatingReorder::operator()(const dnnl::memory& src, const dnnl::memory& dst) {
  const dnnl::memory::desc s = src.get_desc();
  const dnnl::memory::desc d = dst.get_desc();
  if (!reorder_ || s != src_desc_ || d != dst_desc_) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const auto& eng = Context::get().engine();
    reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(eng, s, eng, d, attr));
    src_desc_ = s;
    dst_desc_ = d;
  }
  execute_reorder(reorder_, src, dst);
}

dnnl::memory wrap_plain(std::vector<float>& values, const dims_t& dims) {
  if (static_cast<std::int64_t>(values.size()) != product(dims)) {
    throw core::InternalError("wrap_plain: " + std::to_string(values.size()) + " values for " + dims_text(dims));
  }
  return dnnl::memory(plain_desc(dims), Context::get().engine(), values.data());
}

}  // namespace tessera::engine
