#include "core/output_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <utility>

#include "core/comm.h"
#include "core/error.h"

namespace tessera::core {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const std::string& message) { throw UsageError(message); }

std::string reason(int error) { return std::strerror(error); }

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// What the lock file says about its holder ("tessera tile, pid 123 on host h, started 2026-..."), or "" when it
// says nothing that can be trusted: the holder has just taken the lock and not written it yet, or the text is left
// from a job of this host that has ended (a killed job cannot clear it; the lock is then held by something else).
std::string read_holder(int fd) {
  char buffer[512] = {};
  const ssize_t got = ::pread(fd, buffer, sizeof buffer - 1, 0);
  if (got <= 0) return "";
  std::string text(buffer, static_cast<std::size_t>(got));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  const auto pid_at = text.find(", pid ");
  const auto host_at = text.find(" on host ");
  if (pid_at != std::string::npos && host_at != std::string::npos && host_at > pid_at) {
    const std::string host = text.substr(host_at + 9, text.find(',', host_at) - (host_at + 9));
    const long pid = std::strtol(text.c_str() + pid_at + 6, nullptr, 10);
    if (host == host_name() && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return "";
  }
  return text;
}

std::string describe_self(const std::string& verb) {
  const std::string host = host_name();
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "tessera " + verb + ", pid " + std::to_string(::getpid()) + " on host " + host + ", started " + when;
}

// Runs `check` on rank 0 and makes every rank throw its UsageError (other errors too, as UsageError would lose
// their kind: they are rethrown on rank 0 and reported as internal on the others).
template <typename Check>
void on_root_for_all(const Comm& world, Check&& check) {
  std::string failure;
  int kind = -1;
  if (world.is_root()) {
    try {
      check();
    } catch (const UsageError& e) {
      failure = e.message();
      kind = 0;
    } catch (const std::exception& e) {
      failure = e.what();
      kind = 1;
    }
  }
  if (world.size() > 1) {
    world.broadcast(&kind, sizeof kind, 0);
    world.broadcast(failure, 0);
  }
  if (kind == 0) throw UsageError(failure);
  if (kind == 1) throw InternalError("rank 0 could not prepare the output: " + failure);
}

}  // namespace

void prepare_output_folder(const std::string& folder) {
  if (folder.empty()) refuse("the output folder is empty (give --out or the job's 'output' key)");
  struct stat info {};
  if (::stat(folder.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) refuse("output folder '" + folder + "' is a file, not a folder");
  } else if (errno == ENOTDIR) {
    refuse("output folder '" + folder + "': a part of the path is a file, not a folder");
  } else {
    std::error_code ec;
    fs::create_directories(folder, ec);
    if (ec) refuse("cannot create the output folder '" + folder + "': " + ec.message());
  }
  // access() asks with the real uid, which is the one that writes here (Tessera is never set-uid), and it
  // reports a read-only mount (EROFS) as well as missing permission (EACCES).
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    refuse("output folder '" + folder + "' is not writable: " + reason(errno));
  }
}

void prepare_output_file(const std::string& file) {
  if (file.empty()) refuse("the output file is empty (give --out or the job's 'output' key)");
  struct stat info {};
  if (::stat(file.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    refuse("output file '" + file + "' is a folder, not a file");
  }
  const fs::path parent = fs::path(file).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  try {
    prepare_output_folder(folder);
  } catch (const UsageError& e) {
    refuse("cannot write the output file '" + file + "': " + e.message());
  }
}

void prepare_output_file(const Comm& world, const std::string& file) {
  on_root_for_all(world, [&] { prepare_output_file(file); });
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  [[maybe_unused]] const int cleared = ::ftruncate(fd_, 0);  // this job no longer holds it
  ::close(fd_);                                              // closing the last descriptor releases the flock
}

OutputLock::OutputLock(OutputLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), folder_(std::move(other.folder_)) {}

OutputLock& OutputLock::operator=(OutputLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      [[maybe_unused]] const int cleared = ::ftruncate(fd_, 0);
      ::close(fd_);
    }
    fd_ = std::exchange(other.fd_, -1);
    folder_ = std::move(other.folder_);
  }
  return *this;
}

OutputLock OutputLock::acquire(const std::string& folder, const std::string& verb) {
  prepare_output_folder(folder);
  const std::string path = (fs::path(folder) / output_lock_name).string();
  // O_CLOEXEC: a child process (a bench worker, a shell) must not keep the folder locked after this job ends.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) refuse("output folder '" + folder + "' is not writable: cannot create '" + path + "': " + reason(errno));
  int rc = 0;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? read_holder(fd) : "";
    ::close(fd);  // not ours: closed untouched (an OutputLock clears the file when it lets go)
    if (error != EWOULDBLOCK) {
      refuse("cannot lock the output folder '" + folder + "' (" + path + "): " + reason(error));
    }
    refuse("output folder '" + folder + "' is in use by another Tessera job (" +
           (holder.empty() ? std::string("its lock file is ") + path : holder) +
           "): wait for it to end or write elsewhere");
  }
  OutputLock lock;
  lock.fd_ = fd;
  lock.folder_ = folder;
  // Who holds it, for the message of a job refused later. Best effort: the lock is what protects the folder.
  const std::string text = describe_self(verb) + "\n";
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd, text.data(), text.size(), 0);
  }
  return lock;
}

OutputLock lock_output_folder(const Comm& world, const std::string& folder, const std::string& verb) {
  OutputLock lock;
  on_root_for_all(world, [&] { lock = OutputLock::acquire(folder, verb); });
  return lock;
}

}  // namespace tessera::core
