// Reduced-precision inference: the number format the convolutions and linear layers of a trained model compute
// in, chosen per run (`infer.precision`, `predict.precision`, `--precision`) and checked against the CPU.
//
//   engine::LoadedModel loaded = engine::load_model(path);            // folded, fp32
//   const engine::Precision used = engine::use_precision(*loaded.model, engine::Precision::bf16);
//
// fp32   every layer in float32 (the default; training always runs here).
// bf16   convolutions and linear layers take bfloat16 inputs and weights and accumulate in float32 (oneDNN's
//        AVX-512 BF16 / AMX kernels). The weights are converted once, on the first forward after set-up; the
//        activations stay bfloat16 from one convolution to the next (pooling, residual additions and ReLU run
//        on bfloat16 too); the global pooling's output, the linear layers' outputs and so the logits and the
//        probabilities are float32.
//
// use_precision asks oneDNN which instructions it will use on this CPU (dnnl::get_effective_cpu_isa(), which
// honours ONEDNN_MAX_CPU_ISA): where the CPU lacks them, the model stays in fp32 and one log line says so.
#pragma once

#include <string>

namespace tessera::engine {

class Model;

enum class Precision { fp32, bf16 };

// "fp32", "bf16".
const char* to_string(Precision precision);
// The names above; ConfigError on `key` for anything else.
Precision parse_precision(const std::string& name, const std::string& key);

// True when oneDNN's effective ISA on this CPU has the instructions `precision` needs (fp32: always; bf16:
// AVX-512 BF16, which AMX machines have too).
bool cpu_supports(Precision precision);
// The effective oneDNN ISA for messages, e.g. "avx512_core_amx", "avx2".
std::string cpu_isa_name();

// Switches a folded model (Model::fold_batchnorm) to `requested`, or to fp32 when the CPU cannot run it (one
// log line, on every rank that falls back). Returns the precision the model now computes in. InternalError when
// the model is not folded.
Precision use_precision(Model& model, Precision requested);

}  // namespace tessera::engine
