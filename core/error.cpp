#include "core/error.h"

#include <cerrno>
#include <cstring>

namespace tessera::core {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::usage:
      return "usage error";
    case ErrorKind::config:
      return "config error";
    case ErrorKind::input:
      return "input error";
    case ErrorKind::internal:
      return "internal error";
    case ErrorKind::interrupted:
      return "interrupted";
  }
  return "error";
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::usage:
    case ErrorKind::config:
      return exit_usage;
    case ErrorKind::input:
      return exit_input;
    case ErrorKind::internal:
      return exit_internal;
    case ErrorKind::interrupted:
      return exit_interrupted;
  }
  return exit_internal;
}

Error::Error(ErrorKind kind, std::string message)
    : std::runtime_error(message), kind_(kind), message_(std::move(message)) {
  render();
}

Error& Error::add_context(const std::string& name, const std::string& value) {
  std::string quoted;
  quoted.reserve(value.size() + 2);
  quoted.append(1, '\'').append(value).append(1, '\'');
  context_.emplace_back(name, std::move(quoted));
  render();
  return *this;
}

Error& Error::add_context(const std::string& name, std::int64_t value) {
  context_.emplace_back(name, std::to_string(value));
  render();
  return *this;
}

std::string Error::context(const std::string& name) const {
  for (const auto& [n, v] : context_) {
    if (n == name) {
      return v.size() >= 2 && v.front() == '\'' ? v.substr(1, v.size() - 2) : v;
    }
  }
  return {};
}

void Error::render() {
  // Outermost context first: "slide 'a.svs', level 2: message".
  // Plain appends: GCC 12 reports a false -Wrestrict on `"literal" + std::string` at -O2.
  full_.clear();
  for (auto it = context_.rbegin(); it != context_.rend(); ++it) {
    if (!full_.empty()) full_.append(", ");
    if (it->first.empty()) {  // a context that names itself: shown as is, unquoted
      const std::string& value = it->second;
      const bool quoted = value.size() >= 2 && value.front() == '\'';
      full_.append(quoted ? value.substr(1, value.size() - 2) : value);
      continue;
    }
    full_.append(it->first).append(1, ' ').append(it->second);
  }
  if (!full_.empty()) full_.append(": ");
  full_.append(message_);
}

ConfigError::ConfigError(std::string message, std::string file, int line, std::string key)
    : Error(ErrorKind::config, std::move(message)), file_(std::move(file)), line_(line), key_(std::move(key)) {
  // A command-line source ("--batch", "--set tile.size=0") names itself and its key: "--batch: must be ...".
  if (file_.rfind("--", 0) == 0) {
    add_context("", file_);
    return;
  }
  if (!key_.empty()) add_context("key", key_);
  if (line_ > 0) add_context("line", line_);
  if (!file_.empty()) add_context("file", file_);
}

InputError::InputError(std::string message, std::string file)
    : Error(ErrorKind::input, std::move(message)), file_(std::move(file)) {
  add_context("file", file_);
}

void check_errno(bool ok, const std::string& what) {
  if (!ok) throw InternalError(what + ": " + std::strerror(errno));
}

}  // namespace tessera::core
