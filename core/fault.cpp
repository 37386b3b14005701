#include "core/fault.h"

#include <time.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>

#include "core/signals.h"

namespace tessera::core::fault {
namespace {

enum class Action { kill, stop, wait, signal, fail };

struct Spec {
  std::string point;
  std::int64_t after = 1;
  std::int64_t times = 1;
  std::optional<int> rank;
  Action action = Action::kill;
  int error = 0;   // for Action::fail
  int signal = 0;  // for Action::signal
};

[[noreturn]] void malformed(const std::string& value, const std::string& why) {
  std::fprintf(stderr,
               "tessera: TESSERA_FAULT='%s': %s (expected \"<point>[ after=<n>][ times=<n>][ rank=<r>][ "
               "do=kill|stop|wait|usr1|term|enospc|eio]\")\n",
               value.c_str(), why.c_str());
  std::_Exit(2);
}

std::int64_t parse_count(const std::string& value, const std::string& text, std::int64_t min) {
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    malformed(value, "'" + text + "' is not a number");
  }
  if (used != text.size() || n < min) malformed(value, "'" + text + "' is not a number >= " + std::to_string(min));
  return n;
}

std::optional<Spec> parse(const char* env) {
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string value(env);
  std::istringstream words(value);
  Spec spec;
  words >> spec.point;
  if (spec.point.empty() || spec.point.find('=') != std::string::npos) malformed(value, "no point named first");
  std::string word;
  while (words >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) malformed(value, "'" + word + "' is not key=value");
    const std::string key = word.substr(0, eq);
    const std::string v = word.substr(eq + 1);
    if (key == "after") {
      spec.after = parse_count(value, v, 1);
    } else if (key == "times") {
      spec.times = parse_count(value, v, 1);
    } else if (key == "rank") {
      spec.rank = static_cast<int>(parse_count(value, v, 0));
    } else if (key == "do") {
      if (v == "kill") {
        spec.action = Action::kill;
      } else if (v == "stop") {
        spec.action = Action::stop;
      } else if (v == "wait") {
        spec.action = Action::wait;
      } else if (v == "usr1") {
        spec.action = Action::signal;
        spec.signal = SIGUSR1;
      } else if (v == "term") {
        spec.action = Action::signal;
        spec.signal = SIGTERM;
      } else if (v == "enospc") {
        spec.action = Action::fail;
        spec.error = ENOSPC;
      } else if (v == "eio") {
        spec.action = Action::fail;
        spec.error = EIO;
      } else {
        malformed(value, "unknown action '" + v + "'");
      }
    } else {
      malformed(value, "unknown key '" + key + "'");
    }
  }
  return spec;
}

// This process's MPI world rank as the launcher tells it (Open MPI, PMIx, Slurm), 0 without a launcher.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

struct State {
  std::optional<Spec> spec = parse(std::getenv("TESSERA_FAULT"));
  std::int64_t hits = 0;
  std::mutex mutex;
};

State& state() {
  static State s;
  return s;
}

// Counts a hit of `point`; true when the configured fault fires on this hit.
bool fires(std::string_view point, Action* action, int* error, int* signal) {
  State& s = state();
  if (!s.spec || s.spec->point != point) return false;
  if (s.spec->rank && *s.spec->rank != launcher_rank()) return false;
  std::lock_guard lock(s.mutex);
  const std::int64_t hit = ++s.hits;
  if (hit < s.spec->after || hit - s.spec->after >= s.spec->times) return false;  // no overflow for a huge times=
  *action = s.spec->action;
  *error = s.spec->error;
  *signal = s.spec->signal;
  return true;
}

[[noreturn]] void kill_self(std::string_view point) {
  std::fprintf(stderr, "tessera: fault injected at %.*s: killing process %d\n", static_cast<int>(point.size()),
               point.data(), static_cast<int>(getpid()));
  std::fflush(stderr);
  std::raise(SIGKILL);
  std::_Exit(137);  // not reached
}

// Stops this process (SIGSTOP) until something sends it SIGCONT, then returns: the point where a test holds a rank
// still (e.g. to bring its host's link down) and lets it go on.
void stop_self(std::string_view point) {
  std::fprintf(stderr, "tessera: fault injected at %.*s: stopping process %d until SIGCONT\n",
               static_cast<int>(point.size()), point.data(), static_cast<int>(getpid()));
  std::fflush(stderr);
  std::raise(SIGSTOP);
}

// Waits here until this process receives SIGUSR1 or SIGTERM (recorded by core/signals.h's handlers), however long
// that takes: a test through a batch system then depends on when the system signals (a time limit's warning), not on
// how fast the job ran before it. The request is polled rather than waited for with sigsuspend: the signal may be
// delivered to any thread of the process (MPI's and the thread pools' own), and only the flag is sure to see it.
void wait_for_signal(std::string_view point) {
  std::fprintf(stderr, "tessera: fault injected at %.*s: process %d waits for SIGUSR1 or SIGTERM\n",
               static_cast<int>(point.size()), point.data(), static_cast<int>(getpid()));
  std::fflush(stderr);
  constexpr timespec kPoll{0, 50'000'000};  // 50 ms: the wait ends within this of the signal
  while (stop_requested() == StopRequest::none) nanosleep(&kPoll, nullptr);
}

// Sends `signal` to this process, as a batch system's warning (SIGUSR1) or time limit (SIGTERM) would, at an exact
// place. raise() runs the handler (core/signals.h) before it returns, so the request is recorded when the call site
// goes on.
void signal_self(std::string_view point, int signal) {
  std::fprintf(stderr, "tessera: fault injected at %.*s: raising %s in process %d\n", static_cast<int>(point.size()),
               point.data(), signal == SIGTERM ? "SIGTERM" : "SIGUSR1", static_cast<int>(getpid()));
  std::fflush(stderr);
  std::raise(signal);
}

// The action of a fault that fired at a point: kill, stop, wait or signal here; `fail` is the caller's to report.
void act(std::string_view point, Action action, int signal) {
  if (action == Action::kill) kill_self(point);
  if (action == Action::stop) stop_self(point);
  if (action == Action::wait) wait_for_signal(point);
  if (action == Action::signal) signal_self(point, signal);
}

}  // namespace

bool enabled() { return state().spec.has_value(); }

void at(std::string_view point) {
  Action action{};
  int error = 0, signal = 0;
  if (fires(point, &action, &error, &signal)) act(point, action, signal);
}

int error_at(std::string_view point) {
  Action action{};
  int error = 0, signal = 0;
  if (!fires(point, &action, &error, &signal)) return 0;
  act(point, action, signal);
  return action == Action::fail ? error : 0;
}

}  // namespace tessera::core::fault
