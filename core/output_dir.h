// Output folders: checked before any work, and locked for the life of the job that writes them.
//
// Two jobs writing one folder at once leave it mixed (one job's state file, the other's shards) and a rerun may
// then call the mix "up to date". Every verb that writes a folder therefore takes an advisory lock on
// `<folder>/.tessera.lock` with flock(2) before it writes anything, and a second job on the same folder is refused
// at once (UsageError, exit 2) with the holder named. The kernel drops the lock when the holding process ends, however
// it ends (kill -9, a node's job killed by Slurm): a dead job never leaves a stale lock behind. The lock file itself
// stays in the folder (removing it would let a waiting job lock a file that a third job no longer sees).
//
// Under MPI only world rank 0 takes the lock (it is one job however many ranks write); the other ranks wait for its
// outcome and fail with the same error, so no rank starts work on a folder it may not write.
#pragma once

#include <string>

namespace tessera::core {

class Comm;

// The lock file's name inside an output folder.
inline constexpr const char* output_lock_name = ".tessera.lock";

// Creates `folder` if needed and checks that it can be written: an existing non-folder at the path, a folder that
// cannot be created, and a folder this process may not write (permissions, read-only mount) are UsageErrors
// naming the folder and the reason (exit 2), found before any work.
void prepare_output_folder(const std::string& folder);

// Checks that `file` can be written by the job later: its folder exists or can be made and is writable, and the path
// is not a folder. UsageError naming the file otherwise. Creates the parent folder.
void prepare_output_file(const std::string& file);

// An advisory lock on an output folder, held until destroyed (or the process ends).
class OutputLock {
 public:
  OutputLock() = default;
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock& operator=(OutputLock&& other) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  // prepare_output_folder(folder), then takes `<folder>/.tessera.lock` without waiting and records this process
  // (pid, host, verb, start time) in it. UsageError when another process holds it:
  //   "output folder 'F' is in use by another Tessera job (tessera tile, pid 123 on host h, started ...): wait for
  //    it to end or write elsewhere"
  static OutputLock acquire(const std::string& folder, const std::string& verb);

  bool held() const { return fd_ >= 0; }
  const std::string& folder() const { return folder_; }

 private:
  int fd_ = -1;
  std::string folder_;
};

// Collective over `world`: rank 0 acquires the lock (the other ranks hold an empty OutputLock); when rank 0 cannot,
// every rank throws the same UsageError, so that the job ends before any work.
OutputLock lock_output_folder(const Comm& world, const std::string& folder, const std::string& verb);

// Collective over `world`: prepare_output_file on rank 0, its error thrown on every rank.
void prepare_output_file(const Comm& world, const std::string& file);

}  // namespace tessera::core
