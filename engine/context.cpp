#include "engine/context.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/threads.h"

namespace tessera::engine {
namespace {

// oneDNN's own buffers are 64-byte aligned (one cache line, one AVX-512 register); the scratchpad follows.
constexpr std::size_t scratch_alignment = 64;

}  // namespace

Context& Context::get() {
  static Context context;
  return context;
}

Context::Context() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
  // libgomp's default team size is the number of CPUs in the process's affinity mask (or OMP_NUM_THREADS):
  // the cores this rank may use when the launcher bound it. An unbound rank sees every core of the node,
  // so several ranks on one node would each start that many threads: they share the node's cores instead.
  default_threads_ = omp_get_max_threads();
  const int local_ranks = core::local_rank_count();
  if (std::getenv("OMP_NUM_THREADS") == nullptr && local_ranks > 1 &&
      default_threads_ >= static_cast<int>(std::thread::hardware_concurrency())) {
    default_threads_ = std::max(1, default_threads_ / local_ranks);
  }
  threads_ = default_threads_;
}

void Context::set_threads(int n) {
  threads_ = n > 0 ? n : default_threads_;
  omp_set_num_threads(threads_);
}

void Context::FreeAligned::operator()(void* p) const { std::free(p); }

dnnl::memory Context::scratchpad(const dnnl::memory::desc& desc) {
  const std::size_t bytes = desc.get_size();
  if (bytes > scratch_bytes_) {
    const std::size_t rounded = (bytes + scratch_alignment - 1) / scratch_alignment * scratch_alignment;
    void* p = std::aligned_alloc(scratch_alignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
    scratch_.reset(p);
    scratch_bytes_ = rounded;
  }
  return dnnl::memory(desc, engine_, scratch_.get());
}

dnnl::primitive_attr Context::default_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void Context::execute(const dnnl::primitive& p, const dnnl::primitive_desc_base& pd,
                      std::unordered_map<int, dnnl::memory> args) {
  const dnnl::memory::desc scratch_desc = pd.scratchpad_desc();
  if (scratch_desc.get_size() > 0) args.insert_or_assign(DNNL_ARG_SCRATCHPAD, scratchpad(scratch_desc));
  try {
    p.execute(stream_, args);
  } catch (const dnnl::error& e) {
    throw core::InternalError(std::string("oneDNN primitive failed: ") + e.what());
  }
}

void set_threads(int n) { Context::get().set_threads(n); }
int threads() { return Context::get().threads(); }

}  // namespace tessera::engine
