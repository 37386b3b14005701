#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "core/error.h"

namespace tessera::core {
namespace {

// Removes `temporary` without disturbing errno (the caller's error message reads it).
void remove_quietly(const std::string& temporary) {
  const int saved = errno;
  std::remove(temporary.c_str());
  errno = saved;
}

// Closes a descriptor when it goes out of scope (release() hands the closing back), keeping errno.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ < 0) return;
    const int saved = errno;
    ::close(fd_);
    errno = saved;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

int pwrite_all(int fd, const void* data, std::uint64_t bytes, std::uint64_t offset, std::uint64_t& done) {
  const auto* from = static_cast<const char*>(data);
  done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, from + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? ENOSPC : errno;
    done += static_cast<std::uint64_t>(n);
  }
  return 0;
}

std::string temporary_name(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd >= 0, "cannot reopen '" + path + "'");
  const bool synced = ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  check_errno(synced, "cannot sync '" + path + "'");
}

void sync_folder_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const int fd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

void publish_file(const std::string& temporary, const std::string& path) {
  try {
    sync_file(temporary);
  } catch (...) {
    remove_quietly(temporary);
    throw;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    remove_quietly(temporary);
    check_errno(false, "cannot rename '" + temporary + "' to '" + path + "'");
  }
  sync_folder_of(path);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string temporary = temporary_name(path);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  check_errno(fd >= 0, "cannot create '" + temporary + "'");
  std::uint64_t done = 0;
  if (const int error = pwrite_all(fd, bytes.data(), bytes.size(), 0, done); error != 0) {
    ::close(fd);
    errno = error;
    remove_quietly(temporary);
    check_errno(false, "cannot write '" + temporary + "' (" + std::to_string(done) + " of " +
                           std::to_string(bytes.size()) + " bytes written)");
  }
  const bool synced = ::fsync(fd) == 0;
  int saved = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    if (synced) saved = errno;
    errno = saved;
    remove_quietly(temporary);
    check_errno(false, "cannot write '" + temporary + "'");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    remove_quietly(temporary);
    check_errno(false, "cannot rename '" + temporary + "' to '" + path + "'");
  }
  sync_folder_of(path);
}

void write_atomic(const std::string& path, const std::function<void(const std::string& temporary)>& write) {
  const std::string temporary = temporary_name(path);
  try {
    write(temporary);
  } catch (...) {
    remove_quietly(temporary);
    throw;
  }
  publish_file(temporary, path);
}

void write_atomic_stream(const std::string& path, const std::function<void(const Put& put)>& write) {
  constexpr std::size_t kGatherBytes = std::size_t{1} << 20;
  write_atomic(path, [&](const std::string& temporary) {
    FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
    check_errno(fd.get() >= 0, "cannot create '" + temporary + "'");
    std::string gathered;
    std::uint64_t written = 0;
    const auto flush = [&] {
      std::uint64_t done = 0;
      if (const int error = pwrite_all(fd.get(), gathered.data(), gathered.size(), written, done); error != 0) {
        errno = error;
        check_errno(false, "cannot write '" + temporary + "' (" + std::to_string(written + done) + " bytes written)");
      }
      written += gathered.size();
      gathered.clear();
    };
    write([&](std::string_view bytes) {
      gathered += bytes;
      if (gathered.size() >= kGatherBytes) flush();
    });
    flush();
    check_errno(::close(fd.release()) == 0, "cannot write '" + temporary + "'");
  });
}

}  // namespace tessera::core
