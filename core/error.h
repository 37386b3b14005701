// Tessera's error types. Every failure that reaches the user is a tessera::core::Error carrying its
// kind (which decides the process exit code) and the context it picked up on its way up: the file,
// the slide, the pyramid level and region, the config key and line, the MPI rank.
//
//   try { read_tile(...); } catch (Error& e) { e.add_context("slide", path); throw; }
//
// what() is "<context>: <message>", e.g.
//   "file 'a.svs', level 2, region (0, 512, 256x256): openslide: cannot read tile".
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessera::core {

// What went wrong, from the user's point of view. app/ maps each kind to an exit code.
enum class ErrorKind {
  usage,        // bad command line
  config,       // bad YAML job or --set override
  input,        // bad input data: missing/corrupt slide, broken annotation, truncated shard
  internal,     // a bug or a failing system library: not the user's fault
  interrupted,  // stopped on a signal (core/signals.h): nothing is wrong, the rerun goes on from where it stopped
};

const char* to_string(ErrorKind kind);

// Process exit codes, documented in the README.
enum ExitCode : int {
  exit_ok = 0,
  exit_internal = 1,  // internal failure
  exit_usage = 2,     // usage or configuration error
  exit_input = 3,     // bad input data (also: a batch job in which some items failed)
  // Stopped on SIGUSR1 or SIGTERM with everything done so far recorded: resumable, "requeue me" (core/signals.h).
  // 75 is sysexits.h's EX_TEMPFAIL ("temporary failure; the user is invited to retry").
  exit_interrupted = 75,
};

int exit_code_for(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message);

  ErrorKind kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  const char* what() const noexcept override { return full_.c_str(); }

  // Adds one piece of context, outermost last; rendered "name 'value'" (or "name value" for numbers).
  Error& add_context(const std::string& name, const std::string& value);
  Error& add_context(const std::string& name, std::int64_t value);
  // Named accessors for the common context fields (empty when not set).
  std::string context(const std::string& name) const;

 private:
  void render();

  ErrorKind kind_;
  std::string message_;
  std::vector<std::pair<std::string, std::string>> context_;  // name, rendered value
  std::string full_;
};

// A command-line mistake (unknown verb, missing argument).
class UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(ErrorKind::usage, std::move(message)) {}
};

// A configuration mistake; names the file, the line (1-based, 0 = unknown) and the key. A command-line source
// ("--set tile.size=0", "--batch") is its own file and is shown alone: "--batch: must be at least 1, got 0".
class ConfigError : public Error {
 public:
  ConfigError(std::string message, std::string file, int line, std::string key);
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  const std::string& key() const noexcept { return key_; }

 private:
  std::string file_;
  int line_;
  std::string key_;
};

// Bad input data. The file is mandatory: every input error names the file it is about.
class InputError : public Error {
 public:
  InputError(std::string message, std::string file);
  const std::string& file() const noexcept { return file_; }

 private:
  std::string file_;
};

// A missing input file is the most common input error; it gets its own type so callers can tell.
class FileNotFoundError : public InputError {
 public:
  explicit FileNotFoundError(const std::string& file) : InputError("file not found", file) {}
};

// Damaged pixel data: a region of a slide whose tiles the decoder rejects or warns about ("Corrupt JPEG data"),
// while the slide itself opens. Its own type so that a job may skip such tiles (`tile --on-corrupt-tile skip`)
// while every other input error still fails the slide.
class CorruptTileError : public InputError {
 public:
  CorruptTileError(std::string message, std::string file) : InputError(std::move(message), std::move(file)) {}
};

// A bug or a failing system call or library that is not about bad input.
class InternalError : public Error {
 public:
  explicit InternalError(std::string message) : Error(ErrorKind::internal, std::move(message)) {}
};

// Stopped on a signal before the work was done (core/signals.h); exit code exit_interrupted.
class InterruptedError : public Error {
 public:
  explicit InterruptedError(std::string message) : Error(ErrorKind::interrupted, std::move(message)) {}
};

// Throws InternalError("<what>: <strerror(errno)>") when `ok` is false.
void check_errno(bool ok, const std::string& what);

}  // namespace tessera::core
