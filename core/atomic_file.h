// Atomic, durable publishing of files: every file Tessera writes for others to read (shards, checkpoints,
// heatmaps, images, reports, records) is written under a temporary name beside its final one, synced, and renamed
// over it, so a reader (or a job that is killed, or a disk that fills) sees the old file or the new one, never
// half of one; the folder is synced so that the rename itself survives a crash.
//
//   core::write_file_atomic(path, text);                       // a text or byte string
//   core::write_atomic(path, [&](const std::string& temporary) {  // a library that writes a file by name
//     write_png(temporary, image);
//   });
//   core::write_atomic_stream(path, [&](const core::Put& put) {   // text made piece by piece
//     for (const auto& item : items) put(to_text(item));
//   });
//
// Failures are InternalError naming the file and the system's reason (a full disk: "No space left on device");
// the temporary file is removed and the old file, if any, is left as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tessera::core {

// The name a file is written under before it is published: "<path>.tmp-<pid>" (one per process, so two ranks or
// two jobs never write the same temporary file).
std::string temporary_name(const std::string& path);

// fsync of a closed file, by name (HDF5, libtiff and OpenCV do not sync on close).
void sync_file(const std::string& path);

// fsync of the folder holding `path`, which makes a rename in it durable. Best effort: some file systems cannot
// sync a folder, and the file is complete and in place either way.
void sync_folder_of(const std::string& path);

// Publishes a complete, closed `temporary` as `path`: sync_file, rename over `path`, sync_folder_of. On failure
// the temporary file is removed.
void publish_file(const std::string& temporary, const std::string& path);

// pwrite of `bytes` from `data` at `offset` of descriptor `fd` until all is written (a short write continues, EINTR
// retries): 0, or the errno of the failure (ENOSPC for a write that wrote nothing). `done` gets the bytes written.
int pwrite_all(int fd, const void* data, std::uint64_t bytes, std::uint64_t offset, std::uint64_t& done);

// Writes `bytes` to `path` atomically and durably.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Appends bytes to the file being written by write_atomic_stream.
using Put = std::function<void(std::string_view bytes)>;

// Writes `path` atomically and durably from pieces: `write(put)` puts the file's bytes in order, which are written
// as about 1 MiB gathers, so memory is that buffer and a piece whatever the file's size. When `write` or a write
// throws, the temporary file is removed and the exception passes on.
void write_atomic_stream(const std::string& path, const std::function<void(const Put& put)>& write);

// Calls `write(temporary)`, which must create the complete file under that name, then publishes it as `path`.
// When `write` throws, the temporary file is removed and the exception passes on.
void write_atomic(const std::string& path, const std::function<void(const std::string& temporary)>& write);

}  // namespace tessera::core
