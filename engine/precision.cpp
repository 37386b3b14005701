#include "engine/precision.h"

#include <spdlog/spdlog.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "engine/layers/conv.h"
#include "engine/layers/linear.h"
#include "engine/models/model.h"

namespace tessera::engine {

namespace {

// dnnl::cpu_isa values are bit sets: an ISA includes another when it has all of the other's bits.
bool includes(dnnl::cpu_isa isa, dnnl::cpu_isa feature) {
  const auto have = static_cast<unsigned>(isa), want = static_cast<unsigned>(feature);
  return (have & want) == want;
}

void set_compute_type(Module& module, dnnl::memory::data_type type) {
  if (auto* conv = dynamic_cast<Conv2d*>(&module)) conv->set_compute_type(type);
  if (auto* linear = dynamic_cast<Linear*>(&module)) linear->set_compute_type(type);
  for (Module* child : children_of(module)) set_compute_type(*child, type);
}

}  // namespace

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& key) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw core::ConfigError("unknown precision '" + name + "' (known: fp32, bf16)", "", 0, key);
}

bool cpu_supports(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return true;
    case Precision::bf16:
      return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_bf16);
  }
  return false;
}

std::string cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::all:
      return "all";
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
  }
  return "unknown";
}

Precision use_precision(Model& model, Precision requested) {
  if (!model.folded()) {
    throw core::InternalError("reduced precision needs a model folded for inference (Model::fold_batchnorm)");
  }
  Precision used = requested;
  if (!cpu_supports(requested)) {
    spdlog::warn("precision {} needs AVX-512 BF16, and oneDNN's instruction set here is {}: running in fp32",
                 to_string(requested), cpu_isa_name());
    used = Precision::fp32;
  }
  set_compute_type(model.body(),
                   used == Precision::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32);
  return used;
}

}  // namespace tessera::engine
