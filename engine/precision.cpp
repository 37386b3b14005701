#include "engine/precision.h"

#include <spdlog/spdlog.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/comm.h"
#include "core/error.h"
#include "engine/layers/conv.h"
#include "engine/layers/linear.h"
#include "engine/models/model.h"
#include "engine/models/resnet.h"

namespace tessera::engine {

namespace {

// dnnl::cpu_isa values are bit sets: an ISA includes another when it has all of the other's bits.
bool includes(dnnl::cpu_isa isa, dnnl::cpu_isa feature) {
  const auto have = static_cast<unsigned>(isa), want = static_cast<unsigned>(feature);
  return (have & want) == want;
}

// Calls conv(Conv2d&) for every convolution and join(name, ResidualAdd&) for every residual block's sum, and
// linear(Linear&) for every linear layer, in the model's order.
template <class ConvFn, class JoinFn, class LinearFn>
void visit(Module& module, ConvFn&& conv, JoinFn&& join, LinearFn&& linear) {
  if (auto* c = dynamic_cast<Conv2d*>(&module)) conv(*c);
  if (auto* l = dynamic_cast<Linear*>(&module)) linear(*l);
  for (Module* child : children_of(module)) visit(*child, conv, join, linear);
  if (auto* block = dynamic_cast<ResidualBlock*>(&module)) join(block->name(), block->join());
}

void set_compute_type(Module& module, dnnl::memory::data_type type, Weights weights = Weights::fixed) {
  visit(
      module, [&](Conv2d& conv) { conv.set_compute_type(type, weights); },
      [](const std::string&, ResidualAdd& join) { join.set_int8(0.0f); },
      [&](Linear& linear) { linear.set_compute_type(type, weights); });
}

const ValueRange& range_of(const ActivationRanges& ranges, const std::string& name) {
  const auto found = ranges.find(name);
  if (found == ranges.end()) throw core::InternalError("int8: the calibration has no range for '" + name + "'");
  return found->second;
}

// Real value per step: a tensor's largest |value| over the steps of its type (1 for a tensor that was always 0).
float scale_for(float largest, bool is_signed) {
  return largest > 0.0f ? largest / (is_signed ? 127.0f : 255.0f) : 1.0f;
}

void use_int8(Module& module, const ActivationRanges& ranges) {
  visit(
      module,
      [&](Conv2d& conv) {
        const ValueRange& in = range_of(ranges, conv.name() + ".input");
        const ValueRange& out = range_of(ranges, conv.name() + ".output");
        if (in.min < 0.0f) {
          // A signed input is the normalised image: s8 would keep 127 levels of a range its 256 pixel values
          // span, and that rounding at the first layer reaches every later one (on IDC, the 99th percentile of
          // |ΔP| per patch went from 0.032 to 0.006 with this convolution in fp32). Its output is quantized by
          // the next convolution's src reorder.
          conv.set_compute_type(dnnl::memory::data_type::f32);
          return;
        }
        const bool out_signed = !conv.options().relu;
        conv.set_int8(scale_for(in.abs_max(), false), false,
                      scale_for(out_signed ? out.abs_max() : out.max, out_signed));
      },
      [&](const std::string& name, ResidualAdd& join) {
        const ValueRange& out = range_of(ranges, name + ".output");
        join.set_int8(join.relu() ? scale_for(out.max, false) : scale_for(out.abs_max(), true));
      },
      [](Linear& linear) { linear.set_compute_type(dnnl::memory::data_type::f32); });
}

}  // namespace

std::vector<std::string> calibration_points(Model& model) {
  std::vector<std::string> names;
  visit(
      model.body(),
      [&](Conv2d& conv) {
        names.push_back(conv.name() + ".input");
        names.push_back(conv.name() + ".output");
      },
      [&](const std::string& name, ResidualAdd&) { names.push_back(name + ".output"); }, [](Linear&) {});
  return names;
}

Calibrator::Calibrator(Model& model) : model_(model) {
  if (!model.folded()) throw core::InternalError("calibration needs a model folded for inference");
  for (const std::string& name : calibration_points(model)) ranges_[name];
  visit(
      model.body(),
      [&](Conv2d& conv) {
        if (conv.compute_type() != dnnl::memory::data_type::f32) {
          throw core::InternalError("calibration runs the model in fp32");
        }
        conv.observe(&ranges_.at(conv.name() + ".input"), &ranges_.at(conv.name() + ".output"));
      },
      [&](const std::string& name, ResidualAdd& join) { join.observe(&ranges_.at(name + ".output")); }, [](Linear&) {});
}

Calibrator::~Calibrator() {
  visit(
      model_.body(), [](Conv2d& conv) { conv.observe(nullptr, nullptr); },
      [](const std::string&, ResidualAdd& join) { join.observe(nullptr); }, [](Linear&) {});
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::int8:
      return "int8";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& key) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "int8") return Precision::int8;
  throw core::ConfigError("unknown precision '" + name + "' (known: fp32, bf16, int8)", "", 0, key);
}

bool cpu_supports(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return true;
    case Precision::bf16:
      return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_bf16);
    case Precision::int8:
      return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_vnni) ||
             includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx2_vnni);
  }
  return false;
}

bool cpu_trains(Precision precision) {
  switch (precision) {
    case Precision::fp32:
      return true;
    case Precision::bf16:
      return includes(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_amx);
    case Precision::int8:
      return false;
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

Precision use_precision(Model& model, Precision requested, const ActivationRanges* ranges) {
  if (!model.folded()) {
    throw core::InternalError("reduced precision needs a model folded for inference (Model::fold_batchnorm)");
  }
  if (requested == Precision::int8) {
    if (ranges == nullptr) throw core::InternalError("int8 needs the calibration's activation ranges");
    for (const std::string& name : calibration_points(model)) (void)range_of(*ranges, name);
  }
  Precision used = requested;
  if (!cpu_supports(requested)) {
    spdlog::warn("precision {} needs {}, and oneDNN's instruction set here is {}: running in fp32",
                 to_string(requested), requested == Precision::int8 ? "VNNI (AVX-512 or AVX2)" : "AVX-512 BF16",
                 cpu_isa_name());
    used = Precision::fp32;
  }
  if (used == Precision::int8) {
    use_int8(model.body(), *ranges);
  } else {
    set_compute_type(model.body(),
                     used == Precision::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32);
  }
  return used;
}

Precision use_training_precision(Model& model, Precision requested, const core::Comm& comm) {
  if (model.folded()) throw core::InternalError("a model folded for inference cannot train");
  if (requested == Precision::int8) throw core::InternalError("training runs in fp32 or bf16, not int8");
  // Every rank trains in the same precision: the one asked for only where every rank's CPU can.
  const bool here = cpu_trains(requested);
  const bool everywhere = comm.allreduce_value<std::int64_t>(here ? 1 : 0, core::ReduceOp::min) == 1;
  Precision used = requested;
  if (!everywhere) {
    if (comm.is_root()) {
      spdlog::warn(
          "training in {} needs AMX (measured slower than fp32 on AVX-512 BF16 without AMX), and oneDNN's "
          "instruction set {}: training in fp32",
          to_string(requested), here ? "on another rank has none" : "here is " + cpu_isa_name());
    }
    used = Precision::fp32;
  }
  set_compute_type(model.body(), used == Precision::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
                   Weights::trained);
  return used;
}

}  // namespace tessera::engine
