#include "core/signals.h"

#include <atomic>
#include <csignal>
#include <cstdint>

namespace tessera::core {
namespace {

// Lock-free, so that the handler may store to it (a handler may touch only async-signal-safe things).
std::atomic<int> g_request{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) {
  const int wanted = static_cast<int>(signal == SIGTERM ? StopRequest::now : StopRequest::finish_item);
  int seen = g_request.load(std::memory_order_relaxed);
  while (seen < wanted && !g_request.compare_exchange_weak(seen, wanted, std::memory_order_relaxed)) {
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGUSR1, SIGTERM}) check_errno(sigaction(signal, &action, nullptr) == 0, "sigaction");
}

StopRequest stop_requested() noexcept { return static_cast<StopRequest>(g_request.load(std::memory_order_relaxed)); }

StopRequest agree_stop(const Comm& comm) {
  const auto mine = static_cast<std::int64_t>(stop_requested());
  if (comm.size() <= 1) return static_cast<StopRequest>(mine);
  return static_cast<StopRequest>(comm.allreduce_value(mine, ReduceOp::max));
}

const char* signal_name(StopRequest request) noexcept {
  switch (request) {
    case StopRequest::finish_item:
      return "SIGUSR1";
    case StopRequest::now:
      return "SIGTERM";
    case StopRequest::none:
      break;
  }
  return "no signal";
}

void throw_if_terminated(const std::string& where) {
  if (stop_requested() == StopRequest::now) {
    throw InterruptedError("SIGTERM received: stopped; " + where + " is left to the rerun");
  }
}

void reset_stop_request() noexcept { g_request.store(0, std::memory_order_relaxed); }

}  // namespace tessera::core
