#include "io/shard.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>
#include <utility>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault.h"
#include "io/annotations.h"
#include "io/hdf5.h"
#include "io/provenance.h"

namespace tessera::io {
namespace {

constexpr const char* shard_format_name = "tessera-shard";
constexpr const char* manifest_format_name = "tessera-shards";
constexpr int manifest_format_version = 1;
constexpr int rgb_channels = 3;
// The shard writer asks the kernel to write images out in pieces of this many bytes
// (ShardWriter::Impl::images_written).
constexpr std::uint64_t kWritebackBytes = std::uint64_t{16} << 20;

// ---------------------------------------------------------------------------------------------------------
// HDF5 plumbing (io/hdf5.h): RAII ids, a quiet error stack, checks that turn failures into Tessera errors, and
// the typed attribute and dataset helpers.

using hdf5::Handle;
using hdf5::Hdf5Checker;
using hdf5::make_file_access;
using hdf5::QuietHdf5;

std::int64_t file_size(int fd) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 ? static_cast<std::int64_t>(info.st_size) : -1;
}

std::string truncated_message(std::uint64_t expected, std::int64_t actual) {
  return "truncated: expected at least " + std::to_string(expected) + " bytes, file has " + std::to_string(actual);
}

// HDF5 refuses a file shorter than the end address its superblock records with
// "truncated file: eof = <size>, sblock->base_addr = <b>, stored_eof = <expected>".
std::string hdf5_truncated_message(const std::string& desc, std::int64_t actual) {
  const auto at = desc.find("stored_eof = ");
  if (at != std::string::npos) {
    char* end = nullptr;
    const unsigned long long expected = std::strtoull(desc.c_str() + at + std::strlen("stored_eof = "), &end, 10);
    if (end != nullptr && end != desc.c_str() + at + std::strlen("stored_eof = ")) {
      return truncated_message(expected, actual);
    }
  }
  return "truncated: file has " + std::to_string(actual) + " bytes (HDF5: " + desc + ")";
}

// A descriptor of `path` for direct writes, and their alignment: file offsets and lengths multiples of `block` (a
// whole page), memory addresses of `memory`. -1 where the file system does not do direct I/O or does not say with
// what alignment (statx's STATX_DIOALIGN: Linux 6.1 or later; not tmpfs, NFS or parallel file systems).
int open_direct_descriptor(const std::string& path, std::uint64_t& block, std::uint64_t& memory) {
#if defined(__linux__) && defined(STATX_DIOALIGN)
  const int direct = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (direct < 0) return -1;
  struct statx info {};
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (::statx(direct, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) != 0 || (info.stx_mask & STATX_DIOALIGN) == 0 ||
      info.stx_dio_offset_align == 0 || info.stx_dio_mem_align == 0 || page == 0 ||
      page % info.stx_dio_offset_align != 0) {
    ::close(direct);
    return -1;
  }
  block = page;
  memory = info.stx_dio_mem_align;
  return direct;
#else
  (void)path;
  (void)block;
  (void)memory;
  return -1;
#endif
}

}  // namespace

std::uint64_t direct_write_alignment(const std::string& path) {
  std::uint64_t block = 0;
  std::uint64_t memory = 0;
  const int direct = open_direct_descriptor(path, block, memory);
  if (direct < 0) return 0;
  ::close(direct);
  return memory;
}

// =========================================================================================================
// ImageBuffer

void ImageBuffer::Free::operator()(std::uint8_t* p) const { std::free(p); }

void ImageBuffer::resize(std::size_t bytes) {
  if (bytes > capacity_) {
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    auto* memory = static_cast<std::uint8_t*>(std::aligned_alloc(kAlignment, rounded));
    if (memory == nullptr) throw std::bad_alloc();
    data_.reset(memory);
    capacity_ = rounded;
  }
  size_ = bytes;
}

// =========================================================================================================
// ShardWriter

struct ShardWriter::Impl {
  std::string path;
  std::string temporary;
  ShardAttributes attributes;
  std::int64_t tile_count = 0;
  std::size_t slide_count = 0;
  std::size_t tile_bytes = 0;

  // Declaration order is destruction order in reverse: datasets close before the file.
  Handle file;
  Handle images;
  Handle labels;
  Handle fractions;
  Handle coords;
  Handle slide_index;
  Handle artefacts;  // only with attributes.artefacts

  // The small per-tile datasets are kept in memory and written once by finish().
  std::vector<std::uint8_t> label_values;
  std::vector<float> fraction_values;
  std::vector<std::int64_t> coord_values;
  std::vector<std::uint32_t> slide_values;
  std::vector<std::uint16_t> artefact_values;
  std::vector<bool> written;
  std::int64_t written_count = 0;
  bool finished = false;

  // The file's descriptor (HDF5's sec2 driver only; else -1) and the images' file offset, for images_written() and
  // write_direct().
  int fd = -1;
  std::uint64_t images_offset = 0;
  bool writeback_hints = true;  // false once sync_file_range proved unsupported for this file
  // Direct image writes (Linux, O_DIRECT): a second descriptor of the temporary file, through which write_direct()
  // hands the whole file pages of a block of tiles to the disk straight from the caller's memory, without the
  // kernel's copy into the page cache (after decoding, the extract phase's largest cost). -1: none (not Linux,
  // another HDF5 driver, a file system without direct I/O, or a direct write refused).
  int direct_fd = -1;
  std::uint64_t direct_block = 0;   // file offsets and lengths of direct writes are multiples of this
  std::uint64_t direct_memory = 0;  // and their memory addresses
  std::uint64_t direct_bytes = 0;   // image bytes written directly so far
  bool past_hdf5 = false;           // true once direct_fd was opened: write_direct() then writes all images
  // Image bytes written since the kernel was last asked to write them out: [pending_from, + pending_bytes).
  std::uint64_t pending_from = 0;
  std::uint64_t pending_bytes = 0;

  // Called after `bytes` of images were written from image byte `from`: once kWritebackBytes of contiguous images
  // are written, asks the kernel to start writing them to the disk, without waiting. finish() must make the shard
  // durable (core::publish_file syncs it), and a sync that finds most of the shard already on its way returns sooner
  // than one that writes all of it then; asking in large pieces keeps the requests few. Only a hint: a failure
  // here is the sync's to report.
  void images_written(std::uint64_t from, std::uint64_t bytes) {
    if (fd < 0 || !writeback_hints || bytes == 0) return;
    if (pending_bytes > 0 && from != pending_from + pending_bytes) start_writeback();
    if (pending_bytes == 0) pending_from = from;
    pending_bytes += bytes;
    if (pending_bytes >= kWritebackBytes) start_writeback();
  }
  void start_writeback() {
#ifdef __linux__
    if (::sync_file_range(fd, static_cast<off_t>(images_offset + pending_from), static_cast<off_t>(pending_bytes),
                          SYNC_FILE_RANGE_WRITE) != 0 &&
        (errno == ENOSYS || errno == EINVAL || errno == ESPIPE)) {
      writeback_hints = false;  // not supported for this file: stop asking
    }
#endif
    pending_bytes = 0;
  }

  // Opens the direct descriptor when the file system does direct I/O and says with what alignment (statx).
  void open_direct() {
    // Whole pages: a page of the file is then written either directly or through the page cache, never both.
    direct_fd = open_direct_descriptor(temporary, direct_block, direct_memory);
    past_hdf5 = direct_fd >= 0;
  }
  void close_direct() {
    // Nothing is buffered on it: each write reached the disk or failed.
    if (direct_fd >= 0) ::close(direct_fd);
    direct_fd = -1;
  }

  // Writes image bytes [from, from + bytes) of `data` past HDF5 once the direct descriptor was opened: the whole
  // file pages among them through it when `data` is aligned for it, the rest through the file's own descriptor (the
  // page cache). From then on HDF5 never writes images: its data-sieve buffer holds a window of the file read before
  // such writes and, flushed later, would put the window's old bytes back over them. False, with nothing written,
  // when direct writes were never on: the caller writes through HDF5. A direct write refused with nothing written
  // (a file system whose stated alignment does not hold) closes the direct descriptor: the page cache from then on.
  // What a short direct write left is written through the page cache, whose failure then names the cause (a full disk,
  // the file size limit). Other failures throw.
  bool write_direct(const std::uint8_t* data, std::uint64_t from, std::uint64_t bytes, const Hdf5Checker& h5,
                    const std::string& what) {
    if (!past_hdf5) return false;
    const std::uint64_t begin = images_offset + from;
    const std::uint64_t end = begin + bytes;
    std::uint64_t first = begin;  // [first, last): written directly
    std::uint64_t last = begin;
    if (direct_fd >= 0) {
      const std::uint64_t pages_from = (begin + direct_block - 1) / direct_block * direct_block;
      const std::uint64_t pages_to = end / direct_block * direct_block;
      if (pages_from < pages_to && reinterpret_cast<std::uintptr_t>(data + (pages_from - begin)) % direct_memory == 0) {
        std::uint64_t done = 0;
        const int error =
            core::pwrite_all(direct_fd, data + (pages_from - begin), pages_to - pages_from, pages_from, done);
        if (error == 0) {
          first = pages_from;
          last = pages_to;
          direct_bytes += last - first;
        } else if (done != 0) {
          first = pages_from;
          last = pages_from + done;
          direct_bytes += done;
        } else if (error == EINVAL) {
          close_direct();
        } else {
          h5.fail_system(what, error);
        }
      }
    }
    std::uint64_t done = 0;
    for (const auto& [at, length] : {std::pair{begin, first - begin}, std::pair{last, end - last}}) {
      if (const int error = core::pwrite_all(fd, data + (at - begin), length, at, done); error != 0) {
        h5.fail_system(what, error);
      }
    }
    if (first == last) images_written(from, bytes);
    return true;
  }

  void close_quietly() {
    close_direct();
    artefacts.close();
    slide_index.close();
    coords.close();
    fractions.close();
    labels.close();
    images.close();
    file.close();
  }
};

ShardWriter::ShardWriter(const std::string& path, const ShardAttributes& attributes, std::int64_t tile_count,
                         const std::vector<std::string>& slides)
    : impl_(std::make_unique<Impl>()) {
  if (attributes.tile_size <= 0) throw core::InternalError("ShardWriter: tile size must be positive");
  if (!(attributes.mpp > 0.0) || !std::isfinite(attributes.mpp)) {
    throw core::InternalError("ShardWriter: mpp must be a positive number");
  }
  if (tile_count < 0) throw core::InternalError("ShardWriter: negative tile count");
  auto& impl = *impl_;
  impl.path = path;
  impl.temporary = core::temporary_name(path);
  impl.attributes = attributes;
  impl.tile_count = tile_count;
  impl.slide_count = slides.size();
  const auto t = static_cast<hsize_t>(attributes.tile_size);
  impl.tile_bytes = static_cast<std::size_t>(t * t * rgb_channels);
  const auto n = static_cast<std::size_t>(tile_count);
  impl.label_values.assign(n, 0);
  impl.fraction_values.assign(n, 0.0f);
  impl.coord_values.assign(2 * n, 0);
  impl.slide_values.assign(n, 0);
  impl.artefact_values.assign(attributes.artefacts ? n : 0, 0);
  impl.written.assign(n, false);

  QuietHdf5 quiet;
  // Errors name the shard being written; HDF5's own text names the temporary file.
  const Hdf5Checker h5(impl.path, core::ErrorKind::internal);
  try {
    Handle fapl = make_file_access(h5);
    impl.file = h5.own(H5Fcreate(impl.temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                       "cannot create the shard");
    const hid_t file = impl.file.get();

    // images: contiguous and allocated now, so the file offset exists from the start and tiles can later be
    // read with one pread per block; never pre-filled (every tile is written, finish() checks).
    const auto hn = static_cast<hsize_t>(tile_count);
    impl.images = hdf5::create_dataset<std::uint8_t>(h5, file, "images", {hn, t, t, static_cast<hsize_t>(rgb_channels)},
                                                     {.allocation = hdf5::DatasetOptions::Allocation::early_unfilled});
    // The handle is a file descriptor only with the sec2 driver (HDF5_DRIVER in the environment can choose
    // another); with any other, no writeback hints.
    const hid_t file_access = H5Fget_access_plist(file);
    const bool sec2 = file_access >= 0 && H5Pget_driver(file_access) == H5FD_SEC2;
    if (file_access >= 0) H5Pclose(file_access);
    void* handle = nullptr;
    if (sec2 && H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 && handle != nullptr) {
      impl.fd = *static_cast<int*>(handle);
    }
    const haddr_t images_offset = H5Dget_offset(impl.images.get());
    if (images_offset == HADDR_UNDEF) impl.fd = -1;  // no offset (an empty shard): nothing to write back
    impl.images_offset = static_cast<std::uint64_t>(images_offset);
    if (impl.fd >= 0) impl.open_direct();
    impl.labels = hdf5::create_dataset<std::uint8_t>(h5, file, "labels", {hn});
    impl.fractions = hdf5::create_dataset<float>(h5, file, "tumor_fraction", {hn});
    impl.coords = hdf5::create_dataset<std::int64_t>(h5, file, "coords", {hn, 2});
    impl.slide_index = hdf5::create_dataset<std::uint32_t>(h5, file, "slide_index", {hn});
    if (attributes.artefacts) impl.artefacts = hdf5::create_dataset<std::uint16_t>(h5, file, "artefacts", {hn});

    Handle slide_ids = hdf5::create_dataset<std::string>(h5, file, "slides", {static_cast<hsize_t>(slides.size())});
    hdf5::write_dataset(h5, slide_ids, slides, "cannot write dataset 'slides'");
    h5.close(slide_ids, "cannot close dataset 'slides'");

    hdf5::write_attribute<std::string>(h5, file, "format", shard_format_name);
    hdf5::write_attribute<std::int32_t>(h5, file, "version", shard_format_version);
    hdf5::write_attribute<std::int32_t>(h5, file, "tile_size", attributes.tile_size);
    hdf5::write_attribute<double>(h5, file, "mpp", attributes.mpp);
    hdf5::write_attribute<std::string>(h5, file, "stain_normalization", attributes.stain_normalization);
  } catch (...) {
    impl.close_quietly();
    std::remove(impl.temporary.c_str());
    throw;
  }
}

ShardWriter::~ShardWriter() {
  if (!impl_ || impl_->finished) return;
  QuietHdf5 quiet;
  impl_->close_quietly();
  std::remove(impl_->temporary.c_str());
}

void ShardWriter::write(std::int64_t first, const std::vector<ShardTileRecord>& records, const std::uint8_t* images) {
  auto& impl = *impl_;
  if (impl.finished) throw core::InternalError("ShardWriter: write after finish() for '" + impl.path + "'");
  const auto count = static_cast<std::int64_t>(records.size());
  if (first < 0 || first > impl.tile_count - count) {
    throw core::InternalError("ShardWriter: tiles [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") outside the shard's " + std::to_string(impl.tile_count) + " tiles ('" + impl.path +
                              "')");
  }
  for (const auto& r : records) {
    if (r.slide_index >= impl.slide_count) {
      throw core::InternalError("ShardWriter: slide index " + std::to_string(r.slide_index) + " but the shard has " +
                                std::to_string(impl.slide_count) + " slides ('" + impl.path + "')");
    }
    if ((r.artefacts & ~kShardArtefactBits) != 0 || (r.artefacts != 0 && !impl.attributes.artefacts)) {
      throw core::InternalError("ShardWriter: artefact bits " + std::to_string(r.artefacts) + " not writable to '" +
                                impl.path + "'");
    }
  }
  if (count == 0) return;
  if (images == nullptr) throw core::InternalError("ShardWriter: no image data");

  QuietHdf5 quiet;
  const Hdf5Checker h5(impl.path, core::ErrorKind::internal);
  const std::string what = "cannot write tiles " + std::to_string(first) + ".." + std::to_string(first + count - 1);
  // Fault point "shard.write" (core/fault.h): do=enospc|eio fails this block of tiles as a full disk or a failing
  // device would, through the same error as a failing H5Dwrite.
  if (const int error = core::fault::error_at("shard.write"); error != 0) h5.fail_system(what, error);
  const std::uint64_t from = static_cast<std::uint64_t>(first) * impl.tile_bytes;
  const std::uint64_t bytes = static_cast<std::uint64_t>(count) * impl.tile_bytes;
  // The images are contiguous at a fixed offset (allocated at creation, never filled): the same bytes land in the
  // same place whether written past HDF5 or through H5Dwrite.
  if (!impl.write_direct(images, from, bytes, h5, what)) {
    const auto t = static_cast<hsize_t>(impl.attributes.tile_size);
    const hsize_t start[4] = {static_cast<hsize_t>(first), 0, 0, 0};
    const hsize_t extent[4] = {static_cast<hsize_t>(count), t, t, static_cast<hsize_t>(rgb_channels)};
    Handle file_space = h5.own(H5Dget_space(impl.images.get()), H5Sclose, "cannot write tiles");
    h5.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, extent, nullptr),
             "cannot select tiles");
    Handle memory_space = h5.own(H5Screate_simple(4, extent, nullptr), H5Sclose, "cannot write tiles");
    h5.check(H5Dwrite(impl.images.get(), H5T_NATIVE_UINT8, memory_space.get(), file_space.get(), H5P_DEFAULT, images),
             what);
    impl.images_written(from, bytes);
  }

  for (std::int64_t k = 0; k < count; ++k) {
    const auto i = static_cast<std::size_t>(first + k);
    const auto& r = records[static_cast<std::size_t>(k)];
    impl.label_values[i] = r.label;
    impl.fraction_values[i] = r.tumor_fraction;
    impl.coord_values[2 * i] = r.x;
    impl.coord_values[2 * i + 1] = r.y;
    impl.slide_values[i] = r.slide_index;
    if (impl.attributes.artefacts) impl.artefact_values[i] = r.artefacts;
    if (!impl.written[i]) {
      impl.written[i] = true;
      ++impl.written_count;
    }
  }
}

std::uint64_t ShardWriter::direct_bytes() const { return impl_->direct_bytes; }

void ShardWriter::write(std::int64_t index, const ShardTileRecord& record, const cv::Mat& rgb) {
  const int t = impl_->attributes.tile_size;
  if (rgb.type() != CV_8UC3 || rgb.rows != t || rgb.cols != t) {
    throw core::InternalError("ShardWriter: tile must be a " + std::to_string(t) + "x" + std::to_string(t) +
                              " CV_8UC3 image ('" + impl_->path + "')");
  }
  const cv::Mat continuous = rgb.isContinuous() ? rgb : rgb.clone();
  write(index, std::vector<ShardTileRecord>{record}, continuous.ptr<std::uint8_t>());
}

void ShardWriter::finish() {
  auto& impl = *impl_;
  if (impl.finished) throw core::InternalError("ShardWriter: finish() called twice for '" + impl.path + "'");
  if (impl.written_count != impl.tile_count) {
    const auto missing = std::find(impl.written.begin(), impl.written.end(), false) - impl.written.begin();
    throw core::InternalError("ShardWriter: " + std::to_string(impl.tile_count - impl.written_count) + " of " +
                              std::to_string(impl.tile_count) + " tiles of '" + impl.path +
                              "' were never written (first: " + std::to_string(missing) + ")");
  }
  {
    QuietHdf5 quiet;
    const Hdf5Checker h5(impl.path, core::ErrorKind::internal);
    hdf5::write_dataset(h5, impl.labels, impl.label_values, "cannot write dataset 'labels'");
    hdf5::write_dataset(h5, impl.fractions, impl.fraction_values, "cannot write dataset 'tumor_fraction'");
    hdf5::write_dataset(h5, impl.coords, impl.coord_values, "cannot write dataset 'coords'");
    hdf5::write_dataset(h5, impl.slide_index, impl.slide_values, "cannot write dataset 'slide_index'");
    if (impl.attributes.artefacts) {
      hdf5::write_dataset(h5, impl.artefacts, impl.artefact_values, "cannot write dataset 'artefacts'");
      h5.close(impl.artefacts, "cannot close dataset 'artefacts'");
    }
    h5.close(impl.slide_index, "cannot close dataset 'slide_index'");
    h5.close(impl.coords, "cannot close dataset 'coords'");
    h5.close(impl.fractions, "cannot close dataset 'tumor_fraction'");
    h5.close(impl.labels, "cannot close dataset 'labels'");
    h5.close(impl.images, "cannot close dataset 'images'");
    h5.close(impl.file, "cannot close the shard");
    impl.close_direct();
  }
  // HDF5 does not sync on close: publish_file makes the data durable before the rename publishes it.
  core::publish_file(impl.temporary, impl.path);
  impl.finished = true;
}

// =========================================================================================================
// ShardFile

std::size_t ShardFile::tile_bytes() const {
  const auto t = static_cast<std::size_t>(attributes_.tile_size);
  return t * t * rgb_channels;
}

ShardFile ShardFile::open(const std::string& path) {
  ShardFile shard;
  shard.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw core::FileNotFoundError(path);
    throw core::InputError(std::string("cannot open: ") + std::strerror(errno), path);
  }
  shard.fd_ = std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) throw core::InputError("not a regular file", path);

  {
    QuietHdf5 quiet;
    const Hdf5Checker h5(path, core::ErrorKind::input);
    Handle fapl = make_file_access(h5);
    const hid_t file_id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (file_id < 0) {
      const hdf5::Failure failure = hdf5::last_failure();
      if (!failure.truncated.empty())
        throw core::InputError(hdf5_truncated_message(failure.truncated, file_size(fd)), path);
      h5.fail("not a readable HDF5 shard", failure.text());
    }
    Handle file(file_id, H5Fclose);

    // Attributes first: a foreign HDF5 file is named as such before any dataset is looked at.
    if (!hdf5::has_attribute(h5, file.get(), "format")) h5.fail("not a Tessera shard (no 'format' attribute)");
    const std::string format = hdf5::read_attribute<std::string>(h5, file.get(), "format");
    if (format != shard_format_name) {
      h5.fail("not a Tessera shard (format attribute is '" + format + "', expected '" + shard_format_name + "')");
    }
    const std::int64_t version = hdf5::read_attribute<std::int64_t>(h5, file.get(), "version");
    if (version < 1) h5.fail("invalid shard format version " + std::to_string(version));
    if (version > shard_format_version) {
      h5.fail("shard format version " + std::to_string(version) + " is newer than this Tessera reads (" +
              std::to_string(shard_format_version) + ")");
    }
    const std::int64_t tile_size = hdf5::read_attribute<std::int64_t>(h5, file.get(), "tile_size");
    if (tile_size <= 0 || tile_size > std::numeric_limits<int>::max() / 4) {
      h5.fail("invalid tile_size attribute " + std::to_string(tile_size));
    }
    shard.attributes_.tile_size = static_cast<int>(tile_size);
    shard.attributes_.mpp = hdf5::read_attribute<double>(h5, file.get(), "mpp");
    if (!(shard.attributes_.mpp > 0.0) || !std::isfinite(shard.attributes_.mpp)) {
      h5.fail("invalid mpp attribute " + std::to_string(shard.attributes_.mpp));
    }
    shard.attributes_.stain_normalization = hdf5::read_attribute<std::string>(h5, file.get(), "stain_normalization");

    hdf5::Dataset images = hdf5::open_dataset(h5, file.get(), "images");
    hdf5::Dataset labels = hdf5::open_dataset(h5, file.get(), "labels");
    hdf5::Dataset fractions = hdf5::open_dataset(h5, file.get(), "tumor_fraction");
    hdf5::Dataset coords = hdf5::open_dataset(h5, file.get(), "coords");
    hdf5::Dataset slide_index = hdf5::open_dataset(h5, file.get(), "slide_index");
    hdf5::Dataset slides = hdf5::open_dataset(h5, file.get(), "slides");

    if (images.type_class != H5T_INTEGER || H5Tget_size(images.type.get()) != 1 ||
        H5Tget_sign(images.type.get()) != H5T_SGN_NONE) {
      h5.fail("dataset 'images' must hold uint8");
    }
    hdf5::expect_class(h5, labels, H5T_INTEGER, "integers");
    hdf5::expect_class(h5, fractions, H5T_FLOAT, "floating-point numbers");
    hdf5::expect_class(h5, coords, H5T_INTEGER, "integers");
    hdf5::expect_class(h5, slide_index, H5T_INTEGER, "integers");
    hdf5::expect_class(h5, slides, H5T_STRING, "strings");

    const auto t = static_cast<hsize_t>(tile_size);
    if (images.dims.size() != 4) {
      h5.fail("dataset 'images' has shape " + hdf5::describe_dims(images.dims) + ", expected [N, " + std::to_string(t) +
              ", " + std::to_string(t) + ", 3]");
    }
    const hsize_t n = images.dims[0];
    hdf5::expect_shape(h5, images, {n, t, t, static_cast<hsize_t>(rgb_channels)});
    hdf5::expect_shape(h5, labels, {n});
    hdf5::expect_shape(h5, fractions, {n});
    hdf5::expect_shape(h5, coords, {n, 2});
    hdf5::expect_shape(h5, slide_index, {n});
    if (slides.dims.size() != 1) {
      h5.fail("dataset 'slides' has shape " + hdf5::describe_dims(slides.dims) + ", expected [S]");
    }

    // Tiles are read with pread at the dataset's file offset, which only exists for contiguous storage.
    Handle dcpl = h5.own(H5Dget_create_plist(images.dataset.get()), H5Pclose, "cannot read the layout of 'images'");
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout != H5D_CONTIGUOUS) {
      const char* name = layout == H5D_CHUNKED ? "chunked" : layout == H5D_COMPACT ? "compact" : "virtual";
      h5.fail(std::string("dataset 'images' is not stored contiguously (layout: ") + name +
              "); write shards with contiguous layout");
    }
    const haddr_t offset = H5Dget_offset(images.dataset.get());
    if (n > 0 && offset == HADDR_UNDEF) {
      h5.fail("dataset 'images' has no contiguous storage in the file (unwritten or external)");
    }
    shard.images_offset_ = n > 0 ? static_cast<std::uint64_t>(offset) : 0;

    const auto count = static_cast<std::size_t>(n);
    // Read wide and checked here: HDF5 would convert a stored -1 or 256 to uint8 by clipping it to a valid-looking
    // 0 or 255. A label that is not 0 or 1 reaches training as an impossible class and prediction as a NaN AUC.
    const std::vector<std::int64_t> stored_labels = hdf5::read_dataset<std::int64_t>(h5, labels);
    shard.labels_.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (stored_labels[i] != 0 && stored_labels[i] != 1) {
        h5.fail("labels[" + std::to_string(i) + "] = " + std::to_string(stored_labels[i]) +
                " is not 0 (normal) or 1 (tumour)");
      }
      shard.labels_[i] = static_cast<std::uint8_t>(stored_labels[i]);
    }
    shard.fractions_ = hdf5::read_dataset<float>(h5, fractions);

    shard.coords_ = hdf5::read_dataset<std::int64_t>(h5, coords);
    shard.slide_index_ = hdf5::read_dataset<std::uint32_t>(h5, slide_index);
    shard.slides_ = hdf5::read_dataset<std::string>(h5, slides);
    for (std::size_t i = 0; i < count; ++i) {
      if (shard.slide_index_[i] >= shard.slides_.size()) {
        h5.fail("slide_index[" + std::to_string(i) + "] = " + std::to_string(shard.slide_index_[i]) +
                " is out of range (" + std::to_string(shard.slides_.size()) + " slides)");
      }
    }

    // Optional (quality control's per-tile bits): absent reads as no artefact. Read wide, like the labels, so a
    // stored value outside uint16 or with a bit no class has is refused rather than clipped into a valid one.
    shard.attributes_.artefacts = hdf5::has_dataset(h5, file.get(), "artefacts");
    shard.artefacts_.assign(count, 0);
    if (shard.attributes_.artefacts) {
      hdf5::Dataset artefacts = hdf5::open_dataset(h5, file.get(), "artefacts");
      hdf5::expect_class(h5, artefacts, H5T_INTEGER, "integers");
      hdf5::expect_shape(h5, artefacts, {n});
      const std::vector<std::int64_t> stored = hdf5::read_dataset<std::int64_t>(h5, artefacts);
      for (std::size_t i = 0; i < count; ++i) {
        if (stored[i] < 0 || (stored[i] & ~static_cast<std::int64_t>(kShardArtefactBits)) != 0) {
          h5.fail("artefacts[" + std::to_string(i) + "] = " + std::to_string(stored[i]) +
                  " has bits no artefact class has (known: 0-" + std::to_string(kShardArtefactClasses - 1) +
                  " and 9, excluded)");
        }
        shard.artefacts_[i] = static_cast<std::uint16_t>(stored[i]);
      }
      h5.close(artefacts.type, "cannot close a datatype");
      h5.close(artefacts.dataset, "cannot close a dataset");
    }

    for (hdf5::Dataset* d : {&images, &labels, &fractions, &coords, &slide_index, &slides}) {
      h5.close(d->type, "cannot close a datatype");
      h5.close(d->dataset, "cannot close a dataset");
    }
    h5.close(dcpl, "cannot close a property list");
    h5.close(file, "cannot close the file");
  }

  const std::uint64_t expected = shard.images_offset_ + static_cast<std::uint64_t>(shard.size()) * shard.tile_bytes();
  const std::int64_t actual = file_size(fd);
  if (actual < 0 || static_cast<std::uint64_t>(actual) < expected)
    throw core::InputError(truncated_message(expected, actual), path);
  return shard;
}

void ShardFile::read_images(std::int64_t first, std::int64_t count, std::uint8_t* out) const {
  if (first < 0 || count < 0 || first > size() - count) {
    throw core::InternalError("ShardFile: tiles [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") outside the shard's " + std::to_string(size()) + " tiles ('" + path_ + "')");
  }
  if (!fd_) throw core::InternalError("ShardFile: read from a shard that was never opened");
  const std::size_t bytes = static_cast<std::size_t>(count) * tile_bytes();
  const auto start = static_cast<std::uint64_t>(images_offset_ + static_cast<std::uint64_t>(first) * tile_bytes());
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(*fd_, out + done, bytes - done, static_cast<off_t>(start + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw core::InputError(std::string("cannot read tiles: ") + std::strerror(errno), path_);
    }
    if (got == 0) {
      const std::uint64_t expected = images_offset_ + static_cast<std::uint64_t>(size()) * tile_bytes();
      throw core::InputError(truncated_message(expected, file_size(*fd_)), path_);
    }
    done += static_cast<std::size_t>(got);
  }
}

void ShardFile::read_images(std::int64_t first, const std::vector<std::uint8_t*>& destinations) const {
  const auto count = static_cast<std::int64_t>(destinations.size());
  if (first < 0 || first > size() - count) {
    throw core::InternalError("ShardFile: tiles [" + std::to_string(first) + ", " + std::to_string(first + count) +
                              ") outside the shard's " + std::to_string(size()) + " tiles ('" + path_ + "')");
  }
  if (!fd_) throw core::InternalError("ShardFile: read from a shard that was never opened");
  const std::size_t bytes = tile_bytes();
  constexpr std::size_t max_vectors = IOV_MAX;
  std::vector<iovec> vectors;
  for (std::size_t done = 0; done < destinations.size();) {
    const std::size_t n = std::min(destinations.size() - done, max_vectors);
    vectors.resize(n);
    for (std::size_t k = 0; k < n; ++k) vectors[k] = {destinations[done + k], bytes};
    const auto start = images_offset_ + static_cast<std::uint64_t>(first + static_cast<std::int64_t>(done)) * bytes;
    const ssize_t got = ::preadv(*fd_, vectors.data(), static_cast<int>(n), static_cast<off_t>(start));
    if (got < 0 && errno == EINTR) continue;
    // A short read or an error: the tiles not wholly read go through read_images(), which retries and names
    // the problem (a truncated file, an I/O error).
    const std::size_t whole = got > 0 ? static_cast<std::size_t>(got) / bytes : 0;
    for (std::size_t k = whole; k < n; ++k) {
      read_images(first + static_cast<std::int64_t>(done + k), 1, destinations[done + k]);
    }
    done += n;
  }
}

cv::Mat ShardFile::read_image(std::int64_t index) const {
  cv::Mat rgb(tile_size(), tile_size(), CV_8UC3);
  read_images(index, 1, rgb.ptr<std::uint8_t>());
  return rgb;
}

// =========================================================================================================
// Manifest

std::int64_t Manifest::total_tiles() const {
  std::int64_t total = 0;
  for (const auto& s : shards) total += s.tiles;
  return total;
}

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Reads manifest fields with errors that name the file and the field ("shards[2].tiles").
class ManifestFields {
 public:
  explicit ManifestFields(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw core::InputError("field '" + field + "': " + problem, file_);
  }

  const json* find(const json& object, const std::string& field, const char* key, bool required) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) {
      if (required) throw core::InputError("missing required field '" + join(field, key) + "'", file_);
      return nullptr;
    }
    return &*it;
  }

  std::string string(const json& object, const std::string& field, const char* key, bool required,
                     const std::string& fallback = {}) const {
    const json* value = find(object, field, key, required);
    if (value == nullptr) return fallback;
    if (!value->is_string()) fail(join(field, key), std::string("expected a string, got ") + value->type_name());
    return value->get<std::string>();
  }

  std::int64_t count(const json& object, const std::string& field, const char* key, bool required) const {
    const json* value = find(object, field, key, required);
    if (value == nullptr) return 0;
    if (!value->is_number_integer()) {
      fail(join(field, key), std::string("expected a non-negative integer, got ") + describe(*value));
    }
    if (value->is_number_unsigned()) {
      const auto v = value->get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(join(field, key), "value " + std::to_string(v) + " is too large");
      }
      return static_cast<std::int64_t>(v);
    }
    const auto v = value->get<std::int64_t>();
    if (v < 0) fail(join(field, key), "expected a non-negative integer, got " + std::to_string(v));
    return v;
  }

  double number(const json& object, const std::string& field, const char* key) const {
    const json* value = find(object, field, key, true);
    if (!value->is_number()) fail(join(field, key), std::string("expected a number, got ") + value->type_name());
    return value->get<double>();
  }

  const json& array(const json& object, const std::string& field, const char* key, bool required) const {
    static const json empty = json::array();
    const json* value = find(object, field, key, required);
    if (value == nullptr) return empty;
    if (!value->is_array()) fail(join(field, key), std::string("expected an array, got ") + value->type_name());
    return *value;
  }

  const json& object_at(const json& array, const std::string& field, std::size_t index) const {
    const json& value = array[index];
    if (!value.is_object()) fail(element(field, index), std::string("expected an object, got ") + value.type_name());
    return value;
  }

  std::vector<std::string> strings(const json& object, const std::string& field, const char* key) const {
    const json& values = array(object, field, key, false);
    std::vector<std::string> result;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!values[i].is_string()) {
        fail(element(join(field, key), i), std::string("expected a string, got ") + values[i].type_name());
      }
      result.push_back(values[i].get<std::string>());
    }
    return result;
  }

  static std::string join(const std::string& field, const char* key) {
    return field.empty() ? std::string(key) : field + "." + key;
  }
  static std::string element(const std::string& field, std::size_t index) {
    return field + "[" + std::to_string(index) + "]";
  }

 private:
  static std::string describe(const json& value) {
    return value.is_number() ? "number " + value.dump() : std::string(value.type_name());
  }
  std::string file_;
};

// The tiling's tissue settings from the effective job a manifest written before the "tissue" field carries
// (core::Config::to_yaml writes every key, so a manifest of tessera tile has all three; a key an older job lacked takes
// today's default). nullopt when the text has no tissue section.
std::optional<TissueSettings> tissue_settings_of(const std::string& yaml_text, const std::string& path) {
  if (yaml_text.empty()) return std::nullopt;
  TissueSettings settings;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    const YAML::Node tissue = root.IsMap() ? root["tissue"] : YAML::Node();
    if (!tissue || !tissue.IsMap()) return std::nullopt;
    if (const YAML::Node v = tissue["min_fraction"]) settings.min_fraction = v.as<double>();
    if (const YAML::Node v = tissue["mask_mpp"]) settings.mask_mpp = v.as<double>();
    if (const YAML::Node v = tissue["reject_pen_marks"]) settings.reject_pen_marks = v.as<bool>();
  } catch (const YAML::Exception& e) {
    throw core::InputError(std::string("config_yaml: the tiling job's tissue settings cannot be read: ") + e.what(),
                           path);
  }
  if (!(settings.min_fraction >= 0.0 && settings.min_fraction <= 1.0)) {
    throw core::InputError(
        "config_yaml: tissue.min_fraction " + std::to_string(settings.min_fraction) + " is not a fraction in [0, 1]",
        path);
  }
  if (!(settings.mask_mpp > 0.0) || !std::isfinite(settings.mask_mpp)) {
    throw core::InputError("config_yaml: tissue.mask_mpp " + std::to_string(settings.mask_mpp) + " is not positive",
                           path);
  }
  return settings;
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw core::FileNotFoundError(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError(std::string("cannot open: ") + std::strerror(errno), path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw core::InputError("cannot read", path);

  json doc;
  try {
    doc = json::parse(text.str());
  } catch (const json::exception& e) {
    // parse_error for broken syntax; out_of_range (406) for a number past a double's range, e.g. 1e400.
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; the rest says line, column and what is wrong.
    std::string detail = e.what();
    if (const auto tag = detail.find("] "); detail.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) {
      detail.erase(0, tag + 2);
    }
    const auto* syntax = dynamic_cast<const json::parse_error*>(&e);
    throw core::InputError(
        "invalid JSON" + (syntax ? " at byte " + std::to_string(syntax->byte) : std::string()) + ": " + detail, path);
  }
  if (!doc.is_object())
    throw core::InputError(std::string("manifest must be a JSON object, got ") + doc.type_name(), path);

  const ManifestFields f(path);
  const std::string format = f.string(doc, "", "format", true);
  if (format != manifest_format_name) {
    f.fail("format", "expected '" + std::string(manifest_format_name) + "', got '" + format + "'");
  }
  const std::int64_t version = f.count(doc, "", "version", true);
  if (version < 1 || version > manifest_format_version) {
    f.fail("version", "manifest version " + std::to_string(version) + " is not supported (this Tessera reads " +
                          std::to_string(manifest_format_version) + ")");
  }

  Manifest manifest;
  manifest.config_hash = f.string(doc, "", "config_hash", false);
  manifest.config_yaml = f.string(doc, "", "config_yaml", false);
  if (const json* tissue = f.find(doc, "", "tissue", false)) {
    if (!tissue->is_object()) f.fail("tissue", std::string("expected an object, got ") + tissue->type_name());
    TissueSettings settings;
    settings.min_fraction = f.number(*tissue, "tissue", "min_fraction");
    settings.mask_mpp = f.number(*tissue, "tissue", "mask_mpp");
    const json* pen = f.find(*tissue, "tissue", "reject_pen_marks", true);
    if (!pen->is_boolean())
      f.fail("tissue.reject_pen_marks", std::string("expected a boolean, got ") + pen->type_name());
    settings.reject_pen_marks = pen->get<bool>();
    if (!(settings.min_fraction >= 0.0 && settings.min_fraction <= 1.0)) {
      f.fail("tissue.min_fraction", "expected a fraction in [0, 1]");
    }
    if (!(settings.mask_mpp > 0.0) || !std::isfinite(settings.mask_mpp)) f.fail("tissue.mask_mpp", "must be positive");
    manifest.tissue = settings;
  } else {
    // A manifest written before the "tissue" field: the settings are in the effective job it carries.
    manifest.tissue = tissue_settings_of(manifest.config_yaml, path);
  }

  const json* attributes = f.find(doc, "", "attributes", true);
  if (!attributes->is_object()) f.fail("attributes", std::string("expected an object, got ") + attributes->type_name());
  const std::int64_t tile_size = f.count(*attributes, "attributes", "tile_size", true);
  if (tile_size <= 0 || tile_size > std::numeric_limits<int>::max() / 4) {
    f.fail("attributes.tile_size", "invalid tile size " + std::to_string(tile_size));
  }
  manifest.attributes.tile_size = static_cast<int>(tile_size);
  manifest.attributes.mpp = f.number(*attributes, "attributes", "mpp");
  if (!(manifest.attributes.mpp > 0.0)) f.fail("attributes.mpp", "must be positive");
  manifest.attributes.stain_normalization =
      f.string(*attributes, "attributes", "stain_normalization", false, ShardAttributes{}.stain_normalization);

  const json& shards = f.array(doc, "", "shards", true);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string field = ManifestFields::element("shards", i);
    const json& s = f.object_at(shards, "shards", i);
    ManifestShard shard;
    shard.file = f.string(s, field, "file", true);
    if (shard.file.empty()) f.fail(field + ".file", "empty file name");
    shard.tiles = f.count(s, field, "tiles", true);
    shard.normal = f.count(s, field, "normal", false);
    shard.tumour = f.count(s, field, "tumour", false);
    shard.slides = f.strings(s, field, "slides");
    manifest.shards.push_back(std::move(shard));
  }

  const json& slides = f.array(doc, "", "slides", false);
  for (std::size_t i = 0; i < slides.size(); ++i) {
    const std::string field = ManifestFields::element("slides", i);
    const json& s = f.object_at(slides, "slides", i);
    ManifestSlide slide;
    slide.id = f.string(s, field, "id", true);
    slide.path = f.string(s, field, "path", false);
    slide.label = f.string(s, field, "label", false);
    slide.split = f.string(s, field, "split", false);
    slide.tiles = f.count(s, field, "tiles", false);
    slide.normal = f.count(s, field, "normal", false);
    slide.tumour = f.count(s, field, "tumour", false);
    slide.corrupt_tiles = f.count(s, field, "corrupt_tiles", false);
    slide.origin = f.string(s, field, "origin", false);
    if (!slide.origin.empty() && slide.origin != slide_origin(true) && slide.origin != slide_origin(false)) {
      f.fail(field + ".origin", "expected 'synthetic' or 'real', got '" + slide.origin + "'");
    }
    for (const auto& [key, counts] :
         {std::pair{"qc_dropped_tiles", &slide.qc_dropped_tiles}, std::pair{"qc_kept_tiles", &slide.qc_kept_tiles}}) {
      if (!s.contains(key)) continue;
      const json& by_class = s[key];
      if (!by_class.is_object()) f.fail(field + "." + key, "expected an object of counts");
      for (const auto& [name, value] : by_class.items()) {
        if (!value.is_number_integer() || value.get<std::int64_t>() < 0) {
          f.fail(field + "." + key + "." + name, "expected a count (an integer >= 0)");
        }
        (*counts)[name] = value.get<std::int64_t>();
      }
    }
    manifest.slides.push_back(std::move(slide));
  }

  const json& failures = f.array(doc, "", "failures", false);
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const std::string field = ManifestFields::element("failures", i);
    const json& s = f.object_at(failures, "failures", i);
    manifest.failures.push_back({f.string(s, field, "slide", true), f.string(s, field, "error", true)});
  }
  return manifest;
}

void write_manifest(const std::string& path, const Manifest& manifest) {
  ordered_json doc;
  doc["format"] = manifest_format_name;
  doc["version"] = manifest_format_version;
  doc["config_hash"] = manifest.config_hash;
  doc["attributes"] = {{"tile_size", manifest.attributes.tile_size},
                       {"mpp", manifest.attributes.mpp},
                       {"stain_normalization", manifest.attributes.stain_normalization}};
  if (manifest.tissue) {
    doc["tissue"] = {{"min_fraction", manifest.tissue->min_fraction},
                     {"mask_mpp", manifest.tissue->mask_mpp},
                     {"reject_pen_marks", manifest.tissue->reject_pen_marks}};
  }
  doc["shards"] = ordered_json::array();
  for (const auto& s : manifest.shards) {
    doc["shards"].push_back(
        {{"file", s.file}, {"tiles", s.tiles}, {"normal", s.normal}, {"tumour", s.tumour}, {"slides", s.slides}});
  }
  doc["slides"] = ordered_json::array();
  for (const auto& s : manifest.slides) {
    doc["slides"].push_back({{"id", s.id},
                             {"path", s.path},
                             {"label", s.label},
                             {"split", s.split},
                             {"tiles", s.tiles},
                             {"normal", s.normal},
                             {"tumour", s.tumour},
                             {"corrupt_tiles", s.corrupt_tiles}});
    if (!s.origin.empty()) doc["slides"].back()["origin"] = s.origin;
    if (!s.qc_dropped_tiles.empty()) doc["slides"].back()["qc_dropped_tiles"] = s.qc_dropped_tiles;
    if (!s.qc_kept_tiles.empty()) doc["slides"].back()["qc_kept_tiles"] = s.qc_kept_tiles;
  }
  doc["failures"] = ordered_json::array();
  for (const auto& failure : manifest.failures) {
    doc["failures"].push_back({{"slide", failure.slide}, {"error", failure.error}});
  }
  doc["config_yaml"] = manifest.config_yaml;  // last: long, and the least interesting to a reader of the file
  std::string text;
  try {
    text = doc.dump(2) + "\n";
  } catch (const ordered_json::type_error& e) {
    core::InternalError error(std::string("cannot write the manifest: ") + e.what());
    error.add_context("file", path);
    throw error;
  }
  core::write_file_atomic(path, text);
}

}  // namespace tessera::io
