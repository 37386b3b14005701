// The process's oneDNN CPU engine and stream, its OpenMP thread count and one shared scratchpad.
//
// Every primitive in Tessera runs on the one CPU engine and the one in-order stream of Context::get(). oneDNN's
// CPU runtime here is OpenMP, so stream.execute() finishes its work before it returns; layers therefore reuse
// buffers right after an execute without waiting. Primitives are created with scratchpad_mode::user and all of
// them borrow the same grow-only scratchpad (only one primitive runs at a time), instead of each primitive
// keeping its own: a network of 50 convolutions then holds one scratchpad, warm in cache, not 50.
//
// Not thread-safe: one thread drives the engine (the threads work inside the primitives).
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

namespace tessera::engine {

class Context {
 public:
  // The process-wide context, created on first use.
  static Context& get();

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const dnnl::engine& engine() const { return engine_; }
  dnnl::stream& stream() { return stream_; }

  // OpenMP threads used by the primitives and by Tessera's own loops. The default is the number of cores this
  // process may run on (its affinity mask, or OMP_NUM_THREADS when set), so ranks bound to a socket use that
  // socket only. n <= 0 restores the default.
  void set_threads(int n);
  int threads() const { return threads_; }

  // A memory for the scratchpad a primitive asks for (`pd.scratchpad_desc()`), pointing into the shared
  // buffer, which grows as needed. Valid until the next call (a later, larger request may move the buffer).
  dnnl::memory scratchpad(const dnnl::memory::desc& desc);

  // Attributes every Tessera primitive starts from (user scratchpad).
  static dnnl::primitive_attr default_attr();

  // Runs `p` with `args` on the stream, adding the scratchpad argument if `pd` needs one.
  void execute(const dnnl::primitive& p, const dnnl::primitive_desc_base& pd,
               std::unordered_map<int, dnnl::memory> args);

 private:
  Context();

  dnnl::engine engine_;
  dnnl::stream stream_;
  int default_threads_ = 1;
  int threads_ = 1;
  struct FreeAligned {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeAligned> scratch_;
  std::size_t scratch_bytes_ = 0;
};

// Shorthands for Context::get().set_threads(n) / threads().
void set_threads(int n);
int threads();

}  // namespace tessera::engine
