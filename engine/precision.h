// Reduced precision: the number format the convolutions and linear layers of a trained model compute in, chosen
// per run (`infer.precision`, `predict.precision`, `--precision`) and checked against the CPU; and bf16 training
// (`train.precision`, use_training_precision below).
//
//   engine::LoadedModel loaded = engine::load_model(path);            // folded, fp32
//   const engine::Precision used = engine::use_precision(*loaded.model, engine::Precision::bf16);
//
// fp32   every layer in float32 (the default).
// bf16   convolutions and linear layers take bfloat16 inputs and weights and accumulate in float32 (oneDNN's
//        AVX-512 BF16 / AMX kernels). The weights are converted once, on the first forward after set-up; the
//        activations stay bfloat16 from one convolution to the next (pooling, residual additions and ReLU run
//        on bfloat16 too); the global pooling's output, the linear layers' outputs and so the logits and the
//        probabilities are float32.
// int8   post-training quantization (oneDNN's VNNI / AMX int8 kernels): every convolution on a non-negative
//        input takes u8 activations with one scale per tensor and s8 weights with one scale per output channel,
//        accumulates in s32, and writes u8 after a fused ReLU (s8 otherwise) in the next tensor's scale; a
//        convolution whose input goes below 0 (the first, on the normalised image) stays fp32 (see precision.cpp); max
//        pooling runs on the u8 values, the residual sums on u8/s8 with scales (engine/layers/add.h); the global
//        pooling dequantizes, and the linear layers and so the logits are float32. The activation scales come from a
//        calibration (ActivationRanges): the largest |value| of each activation over the calibration tiles (the "max"
//        method), divided by 255 for u8 (a tensor never negative there) or 127 for s8; the weight scales are
//        max |w| / 127 per output channel of the folded weights, computed at set-up.
//
// use_precision asks oneDNN which instructions it will use on this CPU (dnnl::get_effective_cpu_isa(), which
// honours ONEDNN_MAX_CPU_ISA): where the CPU lacks them, the model stays in fp32 and one log line says so.
//
// Training in bf16 (use_training_precision): the convolutions and linear layers compute forward and backward in
// bfloat16 with float32 accumulation and float32 weight gradients, batch norm, pooling and ReLU run on the bfloat16
// activations (batch-norm statistics in float32), and the logits and the loss are float32; the Params — the
// master weights the optimizer steps, the strategies exchange and checkpoints store — stay float32. It needs AMX
// (cpu_trains): with AVX-512 BF16 alone (emulated with ONEDNN_MAX_CPU_ISA on an AMX machine) oneDNN's bf16 kernels
// trained slower than fp32. docs/ARCHITECTURE.md has the layer-by-layer contract.
//
// Calibration: with a Calibrator attached, the folded fp32 model records the range of every activation int8
// quantizes while it runs forward on calibration batches (`tessera quantize` keeps them in the checkpoint).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/comm.h"
#include "engine/tensor.h"

namespace tessera::engine {

class Model;
class Module;

enum class Precision { fp32, bf16, int8 };

// The float32 range of every activation int8 quantizes, by name: "<conv>.input" and "<conv>.output" for every
// convolution, "<block>.output" for the sum of every residual block (names as the model's modules).
using ActivationRanges = std::map<std::string, ValueRange>;

// The names int8 needs for `model`, in the model's order.
std::vector<std::string> calibration_points(Model& model);

// Records the ranges of a folded fp32 model's activations while attached: run forwards, then read ranges().
// InternalError when the model is not folded or not in fp32.
class Calibrator {
 public:
  explicit Calibrator(Model& model);
  ~Calibrator();  // detaches
  Calibrator(const Calibrator&) = delete;
  Calibrator& operator=(const Calibrator&) = delete;

  const ActivationRanges& ranges() const { return ranges_; }

 private:
  Model& model_;
  ActivationRanges ranges_;
};

// "fp32", "bf16", "int8".
const char* to_string(Precision precision);
// The names above; ConfigError on `key` for anything else.
Precision parse_precision(const std::string& name, const std::string& key);

// True when oneDNN's effective ISA on this CPU has the instructions `precision` needs (fp32: always; bf16:
// AVX-512 BF16, which AMX machines have too; int8: VNNI, AVX-512 or AVX2).
bool cpu_supports(Precision precision);
// True when oneDNN's effective ISA makes training in `precision` pay (fp32: always; bf16: AMX, whose bf16 kernels
// trained the compact CNN faster than fp32 here, where AVX-512 BF16's alone, emulated with ONEDNN_MAX_CPU_ISA,
// trained it slower; int8: never).
bool cpu_trains(Precision precision);
// The effective oneDNN ISA for messages, e.g. "avx512_core_amx", "avx2".
std::string cpu_isa_name();

// Switches a folded model (Model::fold_batchnorm) to `requested`, or to fp32 when the CPU cannot run it (one
// log line, on every rank that falls back). Returns the precision the model now computes in. int8 needs
// `ranges` with every calibration_points() name (check them first: a missing one is an InternalError here).
// InternalError when the model is not folded.
Precision use_precision(Model& model, Precision requested, const ActivationRanges* ranges = nullptr);

// Switches an unfolded model's convolutions and linear layers to `requested` (fp32 or bf16) for training, or to
// fp32 where cpu_trains(requested) is false on any rank of `comm` (collective: every rank calls it and all train in
// the same precision; one log line, on the root). Returns the precision they now compute in. InternalError for int8
// or a folded model.
Precision use_training_precision(Model& model, Precision requested, const core::Comm& comm);

}  // namespace tessera::engine
