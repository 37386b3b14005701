// HDF5 plumbing shared by the shard and checkpoint code (internal to tessera_io): RAII ids, a quiet error
// stack, and the text of the last failure.
#pragma once

#include <hdf5.h>

#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"

namespace tessera::io::hdf5 {

// HDF5 prints its error stack to stderr by default; while one of these lives, the current thread's printing
// is off (the library is built thread-safe, so the setting is per thread) and failures become exceptions.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// One HDF5 id with its close function. The destructor ignores errors (it runs while an exception unwinds);
// the success path calls close() and checks the result.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { close(); }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      close();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      closer_ = other.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  herr_t close() {
    herr_t result = 0;
    if (id_ >= 0 && closer_ != nullptr) result = closer_(id_);
    id_ = H5I_INVALID_HID;
    return result;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// What HDF5's error stack says about the last failure of this thread.
struct Failure {
  std::string api;        // outermost description (the API call)
  std::string detail;     // innermost description (where the problem was found)
  std::string truncated;  // the description of an H5E_TRUNCATED entry, if any
  int system_error = 0;   // the errno of a failing system call (a full disk: ENOSPC), 0 if none was recorded
  std::string text() const {
    if (api.empty()) return detail;
    if (detail.empty() || detail == api) return api;
    return api + " (" + detail + ")";
  }
};

// Must run right after the failing call: the next HDF5 API call clears the stack.
Failure last_failure();

// Turns a failing HDF5 call into the right error: a core::InputError naming the file when reading someone's file,
// a core::InternalError (with the file as context) when writing ours fails.
class Hdf5Checker {
 public:
  Hdf5Checker(std::string file, core::ErrorKind kind) : file_(std::move(file)), kind_(kind) {}

  template <typename T>
  T check(T result, const std::string& what) const {
    if (result < 0) fail(what, last_failure());
    return result;
  }
  Handle own(hid_t id, Handle::Closer closer, const std::string& what) const { return Handle(check(id, what), closer); }
  void close(Handle& handle, const std::string& what) const { check(handle.close(), what); }

  // A failing system call under HDF5 (a full disk, an I/O error) is named by its errno, as a failing write of
  // Tessera's own says it ("No space left on device"); HDF5's long description of it adds nothing for a user.
  [[noreturn]] void fail(const std::string& what, const Failure& failure) const {
    if (failure.system_error != 0) fail_system(what, failure.system_error, failure.api);
    fail(what, failure.text());
  }
  [[noreturn]] void fail_system(const std::string& what, int error, const std::string& api = {}) const {
    std::string message = what + ": " + std::strerror(error);
    if (!api.empty()) message.append(" (HDF5: ").append(api).append(")");
    throw_error(message);
  }

  [[noreturn]] void fail(const std::string& what, const std::string& hdf5 = {}) const {
    std::string message = what;
    if (!hdf5.empty()) message.append(": HDF5: ").append(hdf5);
    throw_error(message);
  }

 private:
  [[noreturn]] void throw_error(const std::string& message) const {
    if (kind_ == core::ErrorKind::input) throw core::InputError(message, file_);
    core::InternalError error(message);
    error.add_context("file", file_);
    throw error;
  }

  std::string file_;
  core::ErrorKind kind_;
};

}  // namespace tessera::io::hdf5
