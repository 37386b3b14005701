#include "io/dicom_slide.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dcmtk/config/osconfig.h>  // first of DCMTK's headers
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfcache.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcpixel.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcxfer.h>
#include <dcmtk/dcmjpls/djdecode.h>
#include <dcmtk/oflog/oflog.h>

#include <jpeglib.h>
#include <openjpeg.h>

#include "core/error.h"
#include "io/tile_cache.h"
#include "io/tile_grid.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kPreambleBytes = 128;
constexpr int kChannels = 3;
// A frame side above this is not a slide tile; refusing it bounds what a damaged header could make us allocate.
constexpr int kMaxFrameSide = 16384;
constexpr double kMicronsPerMillimetre = 1000.0;
// Levels whose aspect ratios differ by more than this (besides rounding to whole pixels) are not one image.
constexpr double kAspectTolerance = 0.02;

// DCMTK is set up once per process: its logger would print to stderr what Tessera reports as errors itself, and
// the JPEG-LS decoder is registered for DcmPixelData::getUncompressedFrame.
void init_dcmtk() {
  static std::once_flag once;
  std::call_once(once, [] {
    OFLog::configure(OFLogger::FATAL_LOG_LEVEL);
    DJLSDecoderRegistration::registerCodecs();
  });
}

enum class Codec { raw, jpeg, jpeg2000, jpeg_ls };

struct Syntax {
  Codec codec = Codec::raw;
  std::string name;
};

// The transfer syntaxes Tessera reads; anything else is an error naming it.
std::optional<Syntax> supported_syntax(E_TransferSyntax xfer) {
  const DcmXfer x(xfer);
  switch (xfer) {
    case EXS_LittleEndianExplicit:
    case EXS_LittleEndianImplicit:
      return Syntax{Codec::raw, x.getXferName()};
    case EXS_JPEGProcess1:
    case EXS_JPEGProcess2_4:
      return Syntax{Codec::jpeg, x.getXferName()};
    case EXS_JPEG2000LosslessOnly:
    case EXS_JPEG2000:
      return Syntax{Codec::jpeg2000, x.getXferName()};
    case EXS_JPEGLSLossless:
    case EXS_JPEGLSLossy:
      return Syntax{Codec::jpeg_ls, x.getXferName()};
    default:
      return std::nullopt;
  }
}

std::string text(DcmItem* item, const DcmTagKey& tag, unsigned long pos = 0) {
  OFString value;
  if (item == nullptr || item->findAndGetOFString(tag, value, pos).bad()) return {};
  return std::string(value.c_str());
}

std::optional<double> number(DcmItem* item, const DcmTagKey& tag, unsigned long pos = 0) {
  if (item == nullptr) return std::nullopt;
  Float64 value = 0.0;
  Float32 single = 0.0F;
  if (item->findAndGetFloat64(tag, value, pos).bad()) {
    // FL attributes (Imaged Volume Width) are single precision.
    if (item->findAndGetFloat32(tag, single, pos).bad()) return std::nullopt;
    value = single;
  }
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<std::int64_t> integer(DcmItem* item, const DcmTagKey& tag) {
  if (item == nullptr) return std::nullopt;
  Uint32 u32 = 0;
  if (item->findAndGetUint32(tag, u32).good()) return u32;
  Uint16 u16 = 0;
  if (item->findAndGetUint16(tag, u16).good()) return u16;
  Sint32 s32 = 0;
  if (item->findAndGetSint32(tag, s32).good()) return s32;
  return std::nullopt;
}

DcmItem* sequence_item(DcmItem* item, const DcmTagKey& tag, int index = 0) {
  DcmItem* found = nullptr;
  if (item == nullptr || item->findAndGetSequenceItem(tag, found, index).bad()) return nullptr;
  return found;
}

std::size_t sequence_size(DcmItem* item, const DcmTagKey& tag) {
  DcmSequenceOfItems* sequence = nullptr;
  if (item == nullptr || item->findAndGetSequence(tag, sequence).bad() || sequence == nullptr) return 0;
  return sequence->card();
}

// Full-range YCbCr (JFIF, DICOM YBR_FULL) to RGB.
cv::Vec3b ycbcr_to_rgb(int y, int cb, int cr) {
  const double r = y + 1.402 * (cr - 128);
  const double g = y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128);
  const double b = y + 1.772 * (cb - 128);
  const auto clamp = [](double v) { return static_cast<unsigned char>(std::clamp(std::lround(v), 0L, 255L)); };
  return {clamp(r), clamp(g), clamp(b)};
}

// ---- JPEG (libjpeg) ----

struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  char warning[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// libjpeg reports damaged entropy-coded data ("Corrupt JPEG data: ...", "Premature end of JPEG file") only as a
// warning (level -1) and fills what it could not decode with grey: the first such warning fails the frame.
void jpeg_message(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && errors->warning[0] == '\0') (*cinfo->err->format_message)(cinfo, errors->warning);
}

// One decompressor per thread, reused frame after frame (as libtiff keeps one per directory): creating and destroying
// libjpeg's memory pools for every frame is measurable at thousands of frames per second.
struct JpegDecoder {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  JpegDecoder() {
    cinfo.err = jpeg_std_error(&errors.manager);
    errors.manager.error_exit = jpeg_fail;
    errors.manager.emit_message = jpeg_message;
    jpeg_create_decompress(&cinfo);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
};

// Decodes a JPEG stream into `out` (rows × cols RGB). `ycbcr`: the frame is known to be YCbCr-coded (Photometric
// Interpretation YBR_*), whatever its markers say; otherwise libjpeg decides from the markers, as it does for
// TIFF tiles. Returns an empty string on success, else the decoder's message. No C++ object with a destructor
// lives between setjmp and longjmp.
std::string decode_jpeg(const std::vector<std::uint8_t>& data, bool ycbcr, cv::Mat& out) {
  static thread_local JpegDecoder decoder;
  jpeg_decompress_struct& cinfo = decoder.cinfo;
  JpegErrors& errors = decoder.errors;
  errors.message[0] = '\0';
  errors.warning[0] = '\0';
  if (setjmp(errors.jump) != 0) {
    jpeg_abort_decompress(&cinfo);  // ready for the next frame
    return errors.message;
  }
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (ycbcr && cinfo.num_components == kChannels) cinfo.jpeg_color_space = JCS_YCbCr;
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  if (static_cast<int>(cinfo.output_width) != out.cols || static_cast<int>(cinfo.output_height) != out.rows ||
      cinfo.output_components != kChannels) {
    std::snprintf(errors.message, sizeof(errors.message), "a %ux%u JPEG with %d components in a %dx%d frame",
                  cinfo.output_width, cinfo.output_height, cinfo.output_components, out.cols, out.rows);
    jpeg_abort_decompress(&cinfo);
    return errors.message;
  }
  constexpr int kRowsPerCall = 16;
  std::array<JSAMPROW, kRowsPerCall> rows{};
  while (cinfo.output_scanline < cinfo.output_height) {
    const int first = static_cast<int>(cinfo.output_scanline);
    const int n = std::min(kRowsPerCall, out.rows - first);
    for (int r = 0; r < n; ++r) rows[static_cast<std::size_t>(r)] = out.ptr<unsigned char>(first + r);
    jpeg_read_scanlines(&cinfo, rows.data(), static_cast<JDIMENSION>(n));
  }
  jpeg_finish_decompress(&cinfo);
  if (errors.warning[0] != '\0') return errors.warning;
  return {};
}

// ---- JPEG 2000 (OpenJPEG) ----

struct MemoryStream {
  const std::vector<std::uint8_t>* data;
  std::size_t position = 0;
};

OPJ_SIZE_T stream_read(void* buffer, OPJ_SIZE_T bytes, void* user) {
  auto* s = static_cast<MemoryStream*>(user);
  const std::size_t left = s->data->size() - s->position;
  if (left == 0) return static_cast<OPJ_SIZE_T>(-1);
  const std::size_t n = std::min<std::size_t>(bytes, left);
  std::memcpy(buffer, s->data->data() + s->position, n);
  s->position += n;
  return n;
}

OPJ_OFF_T stream_skip(OPJ_OFF_T bytes, void* user) {
  auto* s = static_cast<MemoryStream*>(user);
  const auto target =
      std::clamp<OPJ_OFF_T>(static_cast<OPJ_OFF_T>(s->position) + bytes, 0, static_cast<OPJ_OFF_T>(s->data->size()));
  const OPJ_OFF_T moved = target - static_cast<OPJ_OFF_T>(s->position);
  s->position = static_cast<std::size_t>(target);
  return moved;
}

OPJ_BOOL stream_seek(OPJ_OFF_T position, void* user) {
  auto* s = static_cast<MemoryStream*>(user);
  if (position < 0 || static_cast<std::size_t>(position) > s->data->size()) return OPJ_FALSE;
  s->position = static_cast<std::size_t>(position);
  return OPJ_TRUE;
}

void keep_opj_error(const char* message, void* user) {
  auto* kept = static_cast<std::string*>(user);
  if (kept->empty()) {
    *kept = message;
    while (!kept->empty() && kept->back() == '\n') kept->pop_back();
  }
}

void ignore_opj_message(const char*, void*) {}

bool is_jp2(const std::vector<std::uint8_t>& data) {
  static constexpr std::array<std::uint8_t, 12> kSignature = {0,   0,   0,    0x0c, 'j',  'P',
                                                              ' ', ' ', 0x0d, 0x0a, 0x87, 0x0a};
  return data.size() >= kSignature.size() && std::equal(kSignature.begin(), kSignature.end(), data.begin());
}

// Decodes a JPEG 2000 codestream (or JP2 file) into `out`; the codestream's multiple-component transform, if any,
// is undone by OpenJPEG. Returns an empty string on success, else the reason.
std::string decode_jpeg2000(const std::vector<std::uint8_t>& data, cv::Mat& out) {
  std::string error;
  MemoryStream source{&data};
  opj_stream_t* stream = opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE);
  opj_stream_set_user_data(stream, &source, nullptr);
  opj_stream_set_user_data_length(stream, data.size());
  opj_stream_set_read_function(stream, stream_read);
  opj_stream_set_skip_function(stream, stream_skip);
  opj_stream_set_seek_function(stream, stream_seek);
  opj_codec_t* codec = opj_create_decompress(is_jp2(data) ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K);
  opj_set_error_handler(codec, keep_opj_error, &error);
  opj_set_warning_handler(codec, ignore_opj_message, nullptr);
  opj_set_info_handler(codec, ignore_opj_message, nullptr);
  opj_dparameters_t parameters;
  opj_set_default_decoder_parameters(&parameters);
  opj_image_t* image = nullptr;
  const bool decoded = opj_setup_decoder(codec, &parameters) != 0 && opj_read_header(stream, codec, &image) != 0 &&
                       opj_decode(codec, stream, image) != 0 && opj_end_decompress(codec, stream) != 0;
  if (!decoded && error.empty()) error = "OpenJPEG could not decode the frame";
  if (decoded) {
    const int components = static_cast<int>(image->numcomps);
    bool fits = components == 1 || components == kChannels;
    for (int c = 0; fits && c < components; ++c) {
      const opj_image_comp_t& comp = image->comps[c];
      fits = static_cast<int>(comp.w) == out.cols && static_cast<int>(comp.h) == out.rows && comp.prec == 8 &&
             comp.sgnd == 0 && comp.data != nullptr;
    }
    if (!fits) {
      error = fmt::format("a JPEG 2000 frame of {} components that is not {}x{} 8-bit unsigned", components, out.cols,
                          out.rows);
    } else {
      for (int r = 0; r < out.rows; ++r) {
        auto* row = out.ptr<cv::Vec3b>(r);
        for (int c = 0; c < out.cols; ++c) {
          const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(out.cols) + c;
          for (int k = 0; k < kChannels; ++k) {
            const int v = image->comps[components == 1 ? 0 : k].data[i];
            row[c][k] = static_cast<unsigned char>(std::clamp(v, 0, 255));
          }
        }
      }
    }
  }
  if (image != nullptr) opj_image_destroy(image);
  opj_destroy_codec(codec);
  opj_stream_destroy(stream);
  return error;
}

// ---- uncompressed frames ----

// Converts one uncompressed 8-bit frame into RGB `out`. `bytes` holds exactly frame_bytes(...) bytes.
void convert_raw(const std::uint8_t* bytes, const std::string& photometric, int samples, int planar, cv::Mat& out) {
  const int rows = out.rows;
  const int cols = out.cols;
  const std::size_t plane = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  for (int r = 0; r < rows; ++r) {
    auto* row = out.ptr<cv::Vec3b>(r);
    for (int c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + c;
      if (samples == 1) {
        const std::uint8_t v = photometric == "MONOCHROME1" ? static_cast<std::uint8_t>(255 - bytes[i]) : bytes[i];
        row[c] = cv::Vec3b(v, v, v);
        continue;
      }
      if (photometric == "YBR_FULL_422") {
        // Two pixels in four bytes: Y1 Y2 Cb Cr.
        const std::size_t pair = i / 2 * 4;
        row[c] = ycbcr_to_rgb(bytes[pair + (i % 2)], bytes[pair + 2], bytes[pair + 3]);
        continue;
      }
      std::array<std::uint8_t, kChannels> v{};
      for (int k = 0; k < kChannels; ++k) v[k] = planar == 1 ? bytes[k * plane + i] : bytes[i * kChannels + k];
      row[c] = photometric == "YBR_FULL" ? ycbcr_to_rgb(v[0], v[1], v[2]) : cv::Vec3b(v[0], v[1], v[2]);
    }
  }
}

std::size_t raw_frame_bytes(int rows, int cols, int samples, const std::string& photometric) {
  const std::size_t pixels = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (photometric == "YBR_FULL_422") return pixels * 2;
  return pixels * static_cast<std::size_t>(samples);
}

// Appends `item` to a `separator`-separated list.
void append(std::string& list, const char* separator, const std::string& item) {
  if (!list.empty()) list += separator;
  list += item;
}

// ---- instances ----

enum class Role { volume, label, overview, thumbnail, other };

// One file of the series, parsed.
struct Instance {
  std::string path;
  std::unique_ptr<DcmFileFormat> file;
  DcmDataset* dataset = nullptr;
  std::string sop_class;
  std::string modality;
  std::string series_uid;
  std::string study_uid;
  std::string frame_of_reference;
  Role role = Role::other;
  std::string role_name;
  Syntax syntax;
  std::string syntax_uid;
  int rows = 0;
  int cols = 0;
  int samples = 0;
  int planar = 0;
  std::string photometric;
  std::int64_t total_cols = 0;
  std::int64_t total_rows = 0;
  std::int64_t frames = 0;
  bool sparse = false;
  std::string optical_path;                // of the frames used
  std::vector<std::string> optical_paths;  // in the Optical Path Sequence
  std::int64_t focal_planes = 1;
  std::string icc_profile;  // the ICC Profile's bytes (of the first optical path, else of the data set)
  std::int64_t tiles_across = 0;
  std::int64_t tiles_down = 0;
  std::vector<std::int64_t> tile_frame;  // tile (row × across + column) → frame, -1: no frame
  std::int64_t missing_tiles = 0;
  std::int64_t unused_frames = 0;  // frames of other optical paths or focal planes
  // Encapsulated pixel data: each frame's fragments [first, first + count) (item 0 is the offset table).
  struct Span {
    std::uint32_t first = 0;
    std::uint32_t count = 0;
  };
  std::vector<Span> spans;
  std::string frame_map;  // how the frames were found: "basic offset table", "one fragment per frame"...
  DcmPixelData* pixel_data = nullptr;
  DcmPixelSequence* fragments = nullptr;
  std::size_t frame_bytes = 0;  // uncompressed
  mutable std::mutex mutex;     // DCMTK reads (the file cache, lazily loaded values)
  mutable DcmFileCache cache;
  // Where the pixel data's values lie in the file, when located and checked at open (see locate_pixel_data): then
  // frames are read with pread(2) on `fd`, by any thread at once, without DCMTK. Empty: DCMTK fetches them.
  int fd = -1;
  std::vector<std::uint64_t> value_offset;  // encapsulated: per item; uncompressed: one, the value's start
  std::vector<std::uint32_t> item_length;   // encapsulated: per item (no DCMTK call on the lock-free path)
  Instance() = default;
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() {
    if (fd >= 0) ::close(fd);
  }

  core::InputError error(const std::string& message) const { return core::InputError(message, path); }
};

// The ICC Profile (OB) an item of `in` holds, as bytes; empty when it has none. One that cannot be read, or is
// larger than any colour profile (a damaged length), is left out with a note: Tessera keeps and reports the profile
// but never applies it, so the pixels are still the file's.
std::string icc_profile_of(const Instance& in, DcmItem* item, std::vector<std::string>& notes) {
  constexpr Uint32 kMaxIccBytes = Uint32{64} << 20;
  DcmElement* icc = nullptr;
  if (item == nullptr || item->findAndGetElement(DCM_ICCProfile, icc).bad() || icc == nullptr ||
      icc->getLength() == 0) {
    return {};
  }
  Uint8* bytes = nullptr;
  if (icc->getLength() > kMaxIccBytes || icc->getUint8Array(bytes).bad() || bytes == nullptr) {
    notes.push_back(fmt::format("{}: unreadable ICC Profile ({} bytes) left out", fs::path(in.path).filename().string(),
                                icc->getLength()));
    return {};
  }
  return std::string(reinterpret_cast<const char*>(bytes), icc->getLength());
}

bool has_dicom_preamble(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, kPreambleBytes + 4> head{};
  if (!in.read(head.data(), head.size())) return false;
  return std::string(head.data() + kPreambleBytes, 4) == "DICM";
}

// Reads the header of `path` (pixel data stays on disk) and the attributes every instance has.
std::unique_ptr<Instance> parse(const std::string& path) {
  auto instance = std::make_unique<Instance>();
  instance->path = path;
  instance->file = std::make_unique<DcmFileFormat>();
  // Values longer than 4 KB (frames) are left in the file and read on demand.
  constexpr Uint32 kMaxReadLength = 4096;
  const OFCondition status =
      instance->file->loadFile(path.c_str(), EXS_Unknown, EGL_noChange, kMaxReadLength, ERM_autoDetect);
  if (status.bad()) throw core::InputError(fmt::format("corrupt DICOM file: {}", status.text()), path);
  instance->dataset = instance->file->getDataset();
  DcmItem* ds = instance->dataset;
  instance->sop_class = text(ds, DCM_SOPClassUID);
  instance->modality = text(ds, DCM_Modality);
  instance->series_uid = text(ds, DCM_SeriesInstanceUID);
  instance->study_uid = text(ds, DCM_StudyInstanceUID);
  instance->frame_of_reference = text(ds, DCM_FrameOfReferenceUID);
  return instance;
}

bool is_slide(const Instance& instance) { return instance.sop_class == UID_VLWholeSlideMicroscopyImageStorage; }

std::string not_a_slide(const Instance& instance) {
  return fmt::format("DICOM file, but not a whole-slide image (modality {})",
                     instance.modality.empty() ? "not given" : instance.modality);
}

// Fetches `count` bytes at `offset` of a lazily loaded value; under the instance's mutex.
void read_value(const Instance& instance, DcmElement* element, std::uint32_t offset, std::uint32_t count,
                std::uint8_t* out) {
  const OFCondition status = element->getPartialValue(out, offset, count, &instance.cache);
  if (status.bad()) throw core::InputError(fmt::format("cannot read pixel data: {}", status.text()), instance.path);
}

// Reads exactly `count` bytes at `offset` of `fd`; false on a short read or an error.
bool read_at(int fd, std::uint64_t offset, std::size_t count, std::uint8_t* out) {
  std::size_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd, out + done, count - done, static_cast<off_t>(offset + done));
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::uint32_t little32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// Finds where the pixel data's values are in the file, for reads that bypass DCMTK. The Pixel Data element ends the
// data set in nearly every file; its position is then the file size less its encoded length, and every header
// on the way (the element's tag, each item's tag and length as DCMTK parsed them, the sequence delimiter) is checked
// against the bytes there. Anything unexpected (trailing padding, an odd layout) leaves value_offset empty, and
// frames are fetched through DCMTK instead: slower, same bytes.
void locate_pixel_data(Instance& in, const std::vector<std::uint32_t>& item_lengths) {
  const int fd = ::open(in.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    return;
  }
  const auto size = static_cast<std::uint64_t>(info.st_size);
  constexpr std::uint64_t kItemHeader = 8;
  std::array<std::uint8_t, 12> head{};
  std::vector<std::uint64_t> offsets;
  bool ok = false;
  if (item_lengths.empty()) {
    // Uncompressed: the value (of even length) ends the file; explicit VR has a 12-byte header, implicit 8.
    const std::uint64_t length = in.pixel_data->getLength() + (in.pixel_data->getLength() % 2);
    if (length + 12 <= size && read_at(fd, size - length - 12, 12, head.data())) {
      const bool explicit_vr = head[0] == 0xe0 && head[1] == 0x7f && head[2] == 0x10 && head[3] == 0x00 &&
                               head[4] == 'O' && (head[5] == 'B' || head[5] == 'W') && little32(&head[8]) == length;
      const bool implicit_vr =
          head[4] == 0xe0 && head[5] == 0x7f && head[6] == 0x10 && head[7] == 0x00 && little32(&head[8]) == length;
      ok = explicit_vr || implicit_vr;
      offsets.push_back(size - length);
    }
  } else {
    std::uint64_t total = kItemHeader;  // the sequence delimiter
    for (const std::uint32_t l : item_lengths) total += kItemHeader + l;
    if (total + 12 <= size && read_at(fd, size - total - 12, 12, head.data())) {
      ok = head[0] == 0xe0 && head[1] == 0x7f && head[2] == 0x10 && head[3] == 0x00 && head[4] == 'O' &&
           (head[5] == 'B' || head[5] == 'W') && little32(&head[8]) == 0xffffffffU;
      std::uint64_t position = size - total;
      for (std::size_t i = 0; ok && i < item_lengths.size(); ++i) {
        std::array<std::uint8_t, kItemHeader> item{};
        ok = read_at(fd, position, item.size(), item.data()) && item[0] == 0xfe && item[1] == 0xff && item[2] == 0x00 &&
             item[3] == 0xe0 && little32(&item[4]) == item_lengths[i];
        offsets.push_back(position + kItemHeader);
        position += kItemHeader + item_lengths[i];
      }
      std::array<std::uint8_t, kItemHeader> end{};
      ok = ok && read_at(fd, position, end.size(), end.data()) && end[0] == 0xfe && end[1] == 0xff && end[2] == 0xdd &&
           end[3] == 0xe0;
    }
  }
  if (!ok) {
    ::close(fd);
    return;
  }
  in.fd = fd;
  in.value_offset = std::move(offsets);
  in.item_length = item_lengths;
}

// Describes the pixels and finds every frame of a slide instance; throws for what cannot be read.
void describe_pixels(Instance& in, std::vector<std::string>& notes) {
  DcmDataset* ds = in.dataset;
  const E_TransferSyntax xfer = ds->getOriginalXfer();
  const auto syntax = supported_syntax(xfer);
  const DcmXfer x(xfer);
  if (!syntax) {
    throw in.error(
        fmt::format("unsupported transfer syntax {} ({}); Tessera reads uncompressed little endian, JPEG "
                    "baseline, JPEG 2000 and JPEG-LS",
                    x.getXferName(), x.getXferID()));
  }
  in.syntax = *syntax;
  in.syntax_uid = x.getXferID();

  const auto rows = integer(ds, DCM_Rows);
  const auto cols = integer(ds, DCM_Columns);
  const auto bits = integer(ds, DCM_BitsAllocated);
  in.samples = static_cast<int>(integer(ds, DCM_SamplesPerPixel).value_or(1));
  in.planar = static_cast<int>(integer(ds, DCM_PlanarConfiguration).value_or(0));
  in.photometric = text(ds, DCM_PhotometricInterpretation);
  if (!rows || !cols || *rows <= 0 || *cols <= 0 || *rows > kMaxFrameSide || *cols > kMaxFrameSide) {
    throw in.error("no usable Rows and Columns (frame size)");
  }
  in.rows = static_cast<int>(*rows);
  in.cols = static_cast<int>(*cols);
  if (bits.value_or(0) != 8 || (in.samples != 1 && in.samples != kChannels)) {
    throw in.error(fmt::format("{} bits allocated, {} samples per pixel: Tessera reads 8-bit RGB or grey slides",
                               bits.value_or(0), in.samples));
  }
  static const std::set<std::string> kPhotometric = {"RGB",     "YBR_FULL",    "YBR_FULL_422", "YBR_ICT",
                                                     "YBR_RCT", "MONOCHROME2", "MONOCHROME1"};
  if (kPhotometric.count(in.photometric) == 0) {
    throw in.error(fmt::format("unsupported Photometric Interpretation '{}'", in.photometric));
  }
  const auto frames = integer(ds, DCM_NumberOfFrames);
  in.frames = frames.value_or(1);
  if (in.frames < 1) throw in.error(fmt::format("Number of Frames {}", in.frames));
  in.total_cols = integer(ds, DCM_TotalPixelMatrixColumns).value_or(in.cols);
  in.total_rows = integer(ds, DCM_TotalPixelMatrixRows).value_or(in.rows);
  if (in.total_cols <= 0 || in.total_rows <= 0) throw in.error("empty Total Pixel Matrix");

  // Optical paths and focal planes: the frames of the first of each are used.
  for (std::size_t i = 0; i < sequence_size(ds, DCM_OpticalPathSequence); ++i) {
    DcmItem* path = sequence_item(ds, DCM_OpticalPathSequence, static_cast<int>(i));
    in.optical_paths.push_back(text(path, DCM_OpticalPathIdentifier));
    if (i == 0) in.icc_profile = icc_profile_of(in, path, notes);
  }
  if (in.icc_profile.empty()) in.icc_profile = icc_profile_of(in, ds, notes);
  in.optical_path = in.optical_paths.empty() ? std::string() : in.optical_paths.front();
  in.focal_planes = std::max<std::int64_t>(1, integer(ds, DCM_TotalPixelMatrixFocalPlanes).value_or(1));

  // The tile grid.
  in.tiles_across = (in.total_cols + in.cols - 1) / in.cols;
  in.tiles_down = (in.total_rows + in.rows - 1) / in.rows;
  const std::int64_t tiles = in.tiles_across * in.tiles_down;
  in.tile_frame.assign(static_cast<std::size_t>(tiles), -1);
  const std::string organisation = text(ds, DCM_DimensionOrganizationType);
  DcmItem* shared = sequence_item(ds, DCM_SharedFunctionalGroupsSequence);
  const std::size_t per_frame = sequence_size(ds, DCM_PerFrameFunctionalGroupsSequence);
  const bool positions = per_frame > 0 && sequence_item(sequence_item(ds, DCM_PerFrameFunctionalGroupsSequence),
                                                        DCM_PlanePositionSlideSequence) != nullptr;
  in.sparse = organisation == "TILED_SPARSE" || (organisation != "TILED_FULL" && positions && in.frames > 1);
  if (!in.sparse) {
    if (in.frames < tiles) {
      throw in.error(fmt::format("frame count {} disagrees with a TILED_FULL matrix of {}x{} tiles", in.frames,
                                 in.tiles_across, in.tiles_down));
    }
    for (std::int64_t t = 0; t < tiles; ++t) in.tile_frame[static_cast<std::size_t>(t)] = t;
    in.unused_frames = in.frames - tiles;
  } else {
    if (static_cast<std::int64_t>(per_frame) != in.frames) {
      throw in.error(
          fmt::format("TILED_SPARSE with {} per-frame functional groups for {} frames", per_frame, in.frames));
    }
    std::optional<std::string> z_used;
    for (std::int64_t f = 0; f < in.frames; ++f) {
      DcmItem* group = sequence_item(ds, DCM_PerFrameFunctionalGroupsSequence, static_cast<int>(f));
      DcmItem* position = sequence_item(group, DCM_PlanePositionSlideSequence);
      if (position == nullptr) position = sequence_item(shared, DCM_PlanePositionSlideSequence);
      const auto column = integer(position, DCM_ColumnPositionInTotalImagePixelMatrix);
      const auto row = integer(position, DCM_RowPositionInTotalImagePixelMatrix);
      if (!column || !row) throw in.error(fmt::format("frame {} has no Plane Position (Slide)", f + 1));
      DcmItem* path_item = sequence_item(group, DCM_OpticalPathIdentificationSequence);
      if (path_item == nullptr) path_item = sequence_item(shared, DCM_OpticalPathIdentificationSequence);
      const std::string path = text(path_item, DCM_OpticalPathIdentifier);
      const std::string z = text(position, DCM_ZOffsetInSlideCoordinateSystem);
      // The focal plane read is the one of the first frame of the optical path read.
      const bool other_path = !in.optical_path.empty() && !path.empty() && path != in.optical_path;
      if (!other_path && !z_used) z_used = z;
      if (other_path || z != *z_used) {
        ++in.unused_frames;
        continue;
      }
      // Positions are 1-based pixels of the total matrix; frames sit on the tile grid.
      const std::int64_t x0 = *column - 1;
      const std::int64_t y0 = *row - 1;
      if (x0 < 0 || y0 < 0 || x0 % in.cols != 0 || y0 % in.rows != 0 || x0 >= in.total_cols || y0 >= in.total_rows) {
        throw in.error(fmt::format("frame {} at column {}, row {} is not on the {}x{} tile grid of the {}x{} matrix",
                                   f + 1, *column, *row, in.cols, in.rows, in.total_cols, in.total_rows));
      }
      auto& slot = in.tile_frame[static_cast<std::size_t>(y0 / in.rows * in.tiles_across + x0 / in.cols)];
      if (slot >= 0) throw in.error(fmt::format("frames {} and {} cover the same tile", slot + 1, f + 1));
      slot = f;
    }
    in.missing_tiles = std::count(in.tile_frame.begin(), in.tile_frame.end(), std::int64_t{-1});
  }
  if (in.unused_frames > 0) {
    notes.push_back(
        fmt::format("{}: {} frames of other optical paths or focal planes not used (the first optical "
                    "path{} and focal plane are read)",
                    fs::path(in.path).filename().string(), in.unused_frames,
                    in.optical_path.empty() ? "" : " '" + in.optical_path + "'"));
  }

  // Where each frame's bytes are.
  DcmElement* element = nullptr;
  if (ds->findAndGetElement(DCM_PixelData, element).bad() || element == nullptr) throw in.error("no Pixel Data");
  in.pixel_data = dynamic_cast<DcmPixelData*>(element);
  if (in.pixel_data == nullptr) throw in.error("Pixel Data of an unexpected type");
  if (in.syntax.codec == Codec::raw) {
    in.frame_bytes = raw_frame_bytes(in.rows, in.cols, in.samples, in.photometric);
    const std::uint64_t needed = static_cast<std::uint64_t>(in.frame_bytes) * static_cast<std::uint64_t>(in.frames);
    if (in.pixel_data->getLength() < needed) {
      throw in.error(fmt::format("frame count {} disagrees with the pixel data ({} bytes, {} needed)", in.frames,
                                 in.pixel_data->getLength(), needed));
    }
    in.frame_map = "uncompressed";
    locate_pixel_data(in, {});
    return;
  }
  DcmPixelSequence* sequence = nullptr;
  if (in.pixel_data->getEncapsulatedRepresentation(xfer, nullptr, sequence).bad() || sequence == nullptr) {
    throw in.error("compressed transfer syntax but no encapsulated pixel data");
  }
  in.fragments = sequence;
  const std::uint32_t items = static_cast<std::uint32_t>(sequence->card());
  if (items < 2) throw in.error("encapsulated pixel data without fragments");
  std::vector<std::uint64_t> item_offset(items, 0);  // from the first fragment's item tag, as offset tables count
  std::vector<std::uint32_t> length(items, 0);
  std::uint64_t position = 0;
  for (std::uint32_t i = 1; i < items; ++i) {
    DcmPixelItem* item = nullptr;
    if (sequence->getItem(item, i).bad() || item == nullptr) throw in.error("unreadable pixel data fragment");
    item_offset[i] = position;
    length[i] = item->getLength();
    constexpr std::uint64_t kItemHeader = 8;
    position += kItemHeader + length[i];
  }
  const auto fragment_at = [&](std::uint64_t offset) -> std::uint32_t {
    const auto it = std::lower_bound(item_offset.begin() + 1, item_offset.end(), offset);
    if (it == item_offset.end() || *it != offset) {
      throw in.error(fmt::format("the offset table's offset {} is not the start of a fragment", offset));
    }
    return static_cast<std::uint32_t>(it - item_offset.begin());
  };
  std::vector<std::uint32_t> starts;
  // A table held as bytes: little-endian offsets of `width` bytes each (4 in the Basic Offset Table; 8 in an Extended
  // Offset Table written with VR OB).
  const auto offsets_in_bytes = [&](DcmElement* held, std::size_t width, const char* name) {
    Uint8* bytes = nullptr;
    if (held->getUint8Array(bytes).bad() || bytes == nullptr || held->getLength() % width != 0) {
      throw in.error(fmt::format("unreadable {}", name));
    }
    for (std::size_t i = 0; i < held->getLength() / width; ++i) {
      std::uint64_t offset = 0;
      std::memcpy(&offset, bytes + width * i, width);  // little endian, as the host
      starts.push_back(fragment_at(offset));
    }
  };
  DcmPixelItem* table = nullptr;
  sequence->getItem(table, 0);
  DcmElement* extended = nullptr;
  if (table != nullptr && table->getLength() > 0) {
    offsets_in_bytes(table, 4, "Basic Offset Table");
    in.frame_map = "basic offset table";
  } else if (ds->findAndGetElement(DCM_ExtendedOffsetTable, extended).good() && extended != nullptr &&
             extended->getLength() > 0) {
    // OV: 64-bit offsets, DCMTK's Uint64 values.
    const Uint64* offsets = nullptr;
    unsigned long count = 0;
    if (ds->findAndGetUint64Array(DCM_ExtendedOffsetTable, offsets, &count).good() && offsets != nullptr) {
      for (unsigned long i = 0; i < count; ++i) starts.push_back(fragment_at(offsets[i]));
    } else {
      offsets_in_bytes(extended, 8, "Extended Offset Table");  // written with VR OB: not conformant, but seen
    }
    in.frame_map = "extended offset table";
  } else if (static_cast<std::int64_t>(items - 1) == in.frames) {
    for (std::uint32_t i = 1; i < items; ++i) starts.push_back(i);
    in.frame_map = "one fragment per frame";
  } else {
    // One walk over the fragments: a frame begins at each fragment that starts a JPEG / JPEG-LS (SOI) or JPEG 2000
    // (SOC, or a JP2 signature box) stream.
    const std::lock_guard lock(in.mutex);
    for (std::uint32_t i = 1; i < items; ++i) {
      if (length[i] < 2) continue;
      std::array<std::uint8_t, 2> head{};
      DcmPixelItem* item = nullptr;
      sequence->getItem(item, i);
      read_value(in, item, 0, 2, head.data());
      const bool start = (head[0] == 0xff && (head[1] == 0xd8 || head[1] == 0x4f)) || (head[0] == 0 && head[1] == 0);
      if (start || starts.empty()) starts.push_back(i);
    }
    in.frame_map = "fragment walk";
  }
  if (static_cast<std::int64_t>(starts.size()) != in.frames) {
    throw in.error(fmt::format("frame count {} disagrees with the pixel data ({} frames found by {})", in.frames,
                               starts.size(), in.frame_map));
  }
  for (std::size_t f = 0; f < starts.size(); ++f) {
    const std::uint32_t end = f + 1 < starts.size() ? starts[f + 1] : items;
    if (end <= starts[f]) throw in.error("the offset table is not in increasing order");
    in.spans.push_back({starts[f], end - starts[f]});
  }
  DcmPixelItem* first = nullptr;
  sequence->getItem(first, 0);
  length[0] = first != nullptr ? first->getLength() : 0;
  locate_pixel_data(in, length);
}

// Decodes frame `frame` of `in` into an RGB tile (frame-sized). Damage throws CorruptTileError.
cv::Mat decode_frame(const Instance& in, std::int64_t frame) {
  cv::Mat tile(in.rows, in.cols, CV_8UC3);
  const auto fail = [&](const std::string& why) {
    return core::CorruptTileError(fmt::format("cannot decode frame {}: {}", frame + 1, why), in.path);
  };
  std::vector<std::uint8_t> bytes;
  if (in.syntax.codec == Codec::raw) {
    bytes.resize(in.frame_bytes);
    const std::uint64_t at = static_cast<std::uint64_t>(frame) * in.frame_bytes;
    if (!in.value_offset.empty()) {
      if (!read_at(in.fd, in.value_offset.front() + at, in.frame_bytes, bytes.data())) throw fail("cannot read it");
    } else {
      const std::lock_guard lock(in.mutex);
      read_value(in, in.pixel_data, static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(in.frame_bytes),
                 bytes.data());
    }
    convert_raw(bytes.data(), in.photometric, in.samples, in.planar, tile);
    return tile;
  }
  const Instance::Span span = in.spans[static_cast<std::size_t>(frame)];
  if (in.syntax.codec == Codec::jpeg_ls) {
    // DCMTK's codec reads the fragments itself.
    const std::size_t size = static_cast<std::size_t>(in.rows) * in.cols * in.samples;
    bytes.resize(size);
    OFString colour;
    OFCondition status;
    {
      const std::lock_guard lock(in.mutex);
      Uint32 start = span.first;  // an item index, the offset table being item 0, as DCMTK counts them
      status = in.pixel_data->getUncompressedFrame(in.dataset, static_cast<Uint32>(frame), start, bytes.data(),
                                                   static_cast<Uint32>(size), colour, &in.cache);
    }
    if (status.bad()) throw fail(std::string("JPEG-LS: ") + status.text());
    convert_raw(bytes.data(), in.samples == 1 ? "MONOCHROME2" : "RGB", in.samples, in.planar, tile);
    return tile;
  }
  if (!in.value_offset.empty()) {
    // One read for the frame's fragments, then their item headers taken out.
    const std::uint64_t begin = in.value_offset[span.first];
    const std::uint32_t last = span.first + span.count - 1;
    const std::uint64_t end = in.value_offset[last] + in.item_length[last];
    bytes.resize(static_cast<std::size_t>(end - begin));
    if (!read_at(in.fd, begin, bytes.size(), bytes.data())) throw fail("cannot read its fragments");
    if (span.count > 1) {
      std::vector<std::uint8_t> joined;
      joined.reserve(bytes.size());
      for (std::uint32_t i = span.first; i <= last; ++i) {
        const auto from = bytes.begin() + static_cast<std::ptrdiff_t>(in.value_offset[i] - begin);
        joined.insert(joined.end(), from, from + in.item_length[i]);
      }
      bytes = std::move(joined);
    }
  } else {
    const std::lock_guard lock(in.mutex);
    for (std::uint32_t i = span.first; i < span.first + span.count; ++i) {
      DcmPixelItem* item = nullptr;
      if (in.fragments->getItem(item, i).bad() || item == nullptr) throw fail("missing fragment");
      const std::size_t at = bytes.size();
      bytes.resize(at + item->getLength());
      if (item->getLength() > 0) read_value(in, item, 0, item->getLength(), bytes.data() + at);
    }
  }
  std::string error;
  if (in.syntax.codec == Codec::jpeg) {
    error = decode_jpeg(bytes, in.photometric.rfind("YBR", 0) == 0, tile);
  } else {
    error = decode_jpeg2000(bytes, tile);
  }
  if (!error.empty()) throw fail(error);
  return tile;
}

Role role_of(DcmItem* ds, std::string& name) {
  const std::string flavour = text(ds, DCM_ImageType, 2);
  name = flavour;
  if (flavour == "VOLUME") return Role::volume;
  if (flavour == "LABEL") return Role::label;
  if (flavour == "OVERVIEW") return Role::overview;
  if (flavour == "THUMBNAIL") return Role::thumbnail;
  return Role::other;
}

}  // namespace

// The name of a folder, also when written with a trailing separator ("a/b/" is "b").
std::string folder_name(const fs::path& folder) {
  fs::path p = fs::absolute(folder).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

std::string dicom_slide_id(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return folder_name(path);
  try {
    return DicomSlide::open(path)->id();
  } catch (const core::Error&) {
    // The slide fails to open later with the reason; its id meanwhile is its folder's name.
    return folder_name(fs::path(path).parent_path());
  }
}

bool looks_like_dicom(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return true;
  return fs::is_regular_file(path, ec) && has_dicom_preamble(path);
}

struct DicomSlide::Impl {
  std::string id;
  std::vector<std::unique_ptr<Instance>> instances;  // levels first, then associated images
  std::vector<Level> levels;
  std::vector<Associated> associated;
  std::optional<double> mpp_x;
  std::optional<double> mpp_y;
  std::string mpp_origin;
  std::map<std::string, std::string> properties;
  std::vector<std::string> notes;
  std::string description;
  std::string icc_profile;
  mutable TileCache cache;

  explicit Impl(std::size_t cache_bytes) : cache(cache_bytes) {}

  cv::Mat frame(std::size_t instance_index, std::int64_t frame_index) const {
    const std::uint64_t key =
        TileCache::key(static_cast<std::uint32_t>(instance_index), static_cast<std::uint32_t>(frame_index));
    return cache.get(key, [&] { return decode_frame(*instances[instance_index], frame_index); });
  }

  // Pixels [lx, lx+width) × [ly, ly+height) of instance `index`'s total pixel matrix, white where no frame is.
  cv::Mat read(std::size_t index, std::int64_t lx, std::int64_t ly, int width, int height) const {
    const Instance& in = *instances[index];
    return assemble_region({in.total_cols, in.total_rows, in.cols, in.rows}, lx, ly, width, height,
                           [&](std::int64_t column, std::int64_t row) {
                             const std::int64_t f =
                                 in.tile_frame[static_cast<std::size_t>(row * in.tiles_across + column)];
                             return f < 0 ? cv::Mat() : frame(index, f);  // TILED_SPARSE: no frame, background
                           });
  }
};

DicomSlide::DicomSlide(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DicomSlide::~DicomSlide() = default;

std::unique_ptr<DicomSlide> DicomSlide::open(const std::string& path, std::size_t cache_bytes) {
  init_dcmtk();
  std::error_code ec;
  const bool folder_given = fs::is_directory(path, ec);
  const fs::path folder = folder_given ? fs::path(path) : fs::path(path).parent_path();
  auto impl = std::make_unique<Impl>(cache_bytes);
  std::vector<std::string>& notes = impl->notes;

  // Every DICOM file of the folder, parsed; the file named is parsed first, so that its own problems are its error.
  std::vector<std::unique_ptr<Instance>> parsed;
  std::string chosen_series;
  if (!folder_given) {
    if (!has_dicom_preamble(path)) throw core::InputError("not a DICOM file (no DICM preamble)", path);
    auto first = parse(path);
    if (!is_slide(*first)) throw core::InputError(not_a_slide(*first), path);
    chosen_series = first->series_uid;
    parsed.push_back(std::move(first));
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(folder.empty() ? fs::path(".") : folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code file_ec;
    if (it->is_regular_file(file_ec)) files.push_back(it->path());
  }
  if (ec) throw core::InputError("cannot list the folder: " + ec.message(), folder.string());
  std::sort(files.begin(), files.end());
  std::size_t not_dicom = 0;
  std::vector<std::string> not_slides;
  for (const auto& file : files) {
    if (!folder_given && fs::equivalent(file, path, ec)) continue;
    if (!has_dicom_preamble(file.string())) {
      ++not_dicom;
      continue;
    }
    auto instance = parse(file.string());
    if (!is_slide(*instance)) {
      not_slides.push_back(file.string());
      if (folder_given && files.size() == 1) throw core::InputError(not_a_slide(*instance), file.string());
      continue;
    }
    parsed.push_back(std::move(instance));
  }
  if (parsed.empty()) {
    throw core::InputError(
        not_slides.empty()
            ? std::string("no DICOM file in the folder")
            : fmt::format("no whole-slide image in the folder ({} DICOM files of other kinds)", not_slides.size()),
        path);
  }
  if (not_dicom > 0) notes.push_back(fmt::format("{} files that are not DICOM ignored", not_dicom));
  if (!not_slides.empty())
    notes.push_back(fmt::format("{} DICOM files that are not slides ignored", not_slides.size()));

  std::map<std::string, std::size_t> series_count;
  for (const auto& p : parsed) ++series_count[p->series_uid];
  if (chosen_series.empty()) {
    if (series_count.size() > 1) {
      std::string list;
      for (const auto& [uid, n] : series_count)
        list += fmt::format("{}{} ({} files)", list.empty() ? "" : ", ", uid, n);
      throw core::InputError(fmt::format("the folder holds {} slide series: {}; name one file of the series to read",
                                         series_count.size(), list),
                             path);
    }
    chosen_series = parsed.front()->series_uid;
  }
  const std::size_t other = parsed.size() - series_count[chosen_series];
  if (other > 0) notes.push_back(fmt::format("{} files of other series in the folder ignored", other));
  impl->id = series_count.size() > 1 ? chosen_series : folder_name(folder.empty() ? fs::path(".") : folder);

  // Sort the series' instances into levels and associated images.
  std::vector<std::unique_ptr<Instance>> volumes;
  std::vector<std::unique_ptr<Instance>> others;
  for (auto& p : parsed) {
    if (p->series_uid != chosen_series) continue;
    p->role = role_of(p->dataset, p->role_name);
    describe_pixels(*p, notes);
    (p->role == Role::volume ? volumes : others).push_back(std::move(p));
  }
  if (volumes.empty()) throw core::InputError("the series has no VOLUME image (only labels or overviews)", path);
  std::stable_sort(volumes.begin(), volumes.end(), [](const auto& a, const auto& b) {
    return a->total_cols * a->total_rows > b->total_cols * b->total_rows;
  });
  // Several optical paths in separate instances: the first optical path of the largest instance is read.
  const std::string optical_path = volumes.front()->optical_path;
  std::set<std::string> skipped_paths;
  std::vector<std::unique_ptr<Instance>> levels;
  for (auto& v : volumes) {
    if (!optical_path.empty() && !v->optical_path.empty() && v->optical_path != optical_path &&
        v->optical_paths.size() == 1) {
      skipped_paths.insert(v->optical_path);
      continue;
    }
    levels.push_back(std::move(v));
  }
  if (!skipped_paths.empty()) {
    std::string list;
    for (const auto& p : skipped_paths) append(list, ", ", p);
    notes.push_back(
        fmt::format("optical path '{}' is read; instances of optical paths {} are not", optical_path, list));
  }
  const Instance& base = *levels.front();
  for (std::size_t i = 1; i < levels.size(); ++i) {
    const Instance& a = *levels[i - 1];
    const Instance& b = *levels[i];
    if (a.total_cols == b.total_cols && a.total_rows == b.total_rows) {
      throw core::InputError(
          fmt::format("two instances for one {}x{} level: {} and {}", b.total_cols, b.total_rows, a.path, b.path),
          path);
    }
    const double ds = static_cast<double>(base.total_cols) / static_cast<double>(b.total_cols);
    const double expected_rows = static_cast<double>(base.total_rows) / ds;
    if (b.total_cols > a.total_cols || b.total_rows > a.total_rows ||
        std::abs(expected_rows - static_cast<double>(b.total_rows)) >
            1.5 * (1.0 + static_cast<double>(base.total_rows) / static_cast<double>(b.total_rows) / ds) +
                kAspectTolerance * static_cast<double>(b.total_rows)) {
      throw core::InputError(
          fmt::format("levels do not form a pyramid of one image: {} is {}x{}, {} is {}x{}", base.path, base.total_cols,
                      base.total_rows, b.path, b.total_cols, b.total_rows),
          path);
    }
  }

  // Resolution.
  DcmItem* shared = sequence_item(base.dataset, DCM_SharedFunctionalGroupsSequence);
  DcmItem* measures = sequence_item(shared, DCM_PixelMeasuresSequence);
  if (measures == nullptr) {
    measures =
        sequence_item(sequence_item(base.dataset, DCM_PerFrameFunctionalGroupsSequence), DCM_PixelMeasuresSequence);
  }
  const auto row_spacing = number(measures, DCM_PixelSpacing, 0);
  const auto column_spacing = number(measures, DCM_PixelSpacing, 1);
  if (row_spacing && column_spacing && *row_spacing > 0.0 && *column_spacing > 0.0) {
    impl->mpp_x = *column_spacing * kMicronsPerMillimetre;
    impl->mpp_y = *row_spacing * kMicronsPerMillimetre;
    impl->mpp_origin = "DICOM Pixel Spacing";
  } else {
    const auto width_mm = number(base.dataset, DCM_ImagedVolumeWidth);
    const auto height_mm = number(base.dataset, DCM_ImagedVolumeHeight);
    if (width_mm && height_mm && *width_mm > 0.0 && *height_mm > 0.0) {
      impl->mpp_x = *width_mm * kMicronsPerMillimetre / static_cast<double>(base.total_cols);
      impl->mpp_y = *height_mm * kMicronsPerMillimetre / static_cast<double>(base.total_rows);
      impl->mpp_origin = "DICOM Imaged Volume Width/Height";
      notes.push_back(
          fmt::format("no Pixel Spacing: resolution {:.4f} um/px from Imaged Volume Width/Height", *impl->mpp_x));
    }
  }

  // Imperfections of real converters, noted.
  std::set<std::string> frames_of_reference;
  for (const auto& l : levels) frames_of_reference.insert(l->frame_of_reference);
  if (frames_of_reference.size() > 1) {
    notes.push_back(
        fmt::format("the levels have {} different Frame of Reference UIDs (one expected)", frames_of_reference.size()));
  }
  if (base.optical_paths.empty()) notes.push_back("no Optical Path Sequence");
  if (base.optical_paths.size() > 1) {
    std::string list;
    for (const auto& p : base.optical_paths) append(list, ", ", p);
    notes.push_back(fmt::format("{} optical paths ({}); '{}' is read", base.optical_paths.size(), list, optical_path));
  }
  if (base.focal_planes > 1) {
    notes.push_back(fmt::format("{} focal planes; the first is read", base.focal_planes));
  }
  if (sequence_item(base.dataset, DCM_TotalPixelMatrixOriginSequence) == nullptr) {
    notes.push_back("no Total Pixel Matrix Origin Sequence");
  }

  std::vector<std::string> encodings;
  for (auto& l : levels) {
    Level level;
    level.width = l->total_cols;
    level.height = l->total_rows;
    level.downsample = (static_cast<double>(base.total_cols) / static_cast<double>(l->total_cols) +
                        static_cast<double>(base.total_rows) / static_cast<double>(l->total_rows)) /
                       2.0;
    level.tile_width = l->cols;
    level.tile_height = l->rows;
    level.file = l->path;
    level.transfer_syntax = l->syntax.name;
    level.frames = l->frames - l->unused_frames;
    level.missing_tiles = l->missing_tiles;
    level.sparse = l->sparse;
    impl->levels.push_back(level);
    if (std::find(encodings.begin(), encodings.end(), l->syntax.name) == encodings.end()) {
      encodings.push_back(l->syntax.name);
    }
    impl->instances.push_back(std::move(l));
  }
  for (auto& o : others) {
    const char* name = o->role == Role::label       ? "label"
                       : o->role == Role::overview  ? "macro"
                       : o->role == Role::thumbnail ? "thumbnail"
                                                    : nullptr;
    if (name == nullptr) {
      notes.push_back(fmt::format("{}: image type '{}' ignored", fs::path(o->path).filename().string(), o->role_name));
      continue;
    }
    if (std::any_of(impl->associated.begin(), impl->associated.end(),
                    [&](const Associated& a) { return a.name == name; })) {
      notes.push_back(fmt::format("{}: a second {} image ignored", fs::path(o->path).filename().string(), name));
      continue;
    }
    impl->associated.push_back({name, o->total_cols, o->total_rows, o->path});
    impl->instances.push_back(std::move(o));
  }
  for (const auto& e : encodings) append(impl->description, ", ", e);
  impl->description += " frames";

  auto& props = impl->properties;
  props["dicom.series-uid"] = base.series_uid;
  props["dicom.study-uid"] = base.study_uid;
  props["dicom.frame-of-reference-uid"] = base.frame_of_reference;
  props["dicom.sop-instance-uids"] = "";
  for (std::size_t i = 0; i < impl->levels.size(); ++i) {
    const Instance& l = *impl->instances[i];
    append(props["dicom.sop-instance-uids"], "\\", text(l.dataset, DCM_SOPInstanceUID));
    const std::string prefix = fmt::format("dicom.level[{}].", i);
    props[prefix + "file"] = fs::path(l.path).filename().string();
    props[prefix + "path"] = l.path;
    props[prefix + "transfer-syntax"] = l.syntax_uid;
    props[prefix + "organization"] = l.sparse ? "TILED_SPARSE" : "TILED_FULL";
    props[prefix + "frame-map"] = l.frame_map;
    props[prefix + "frame-reads"] = l.value_offset.empty() ? "DCMTK" : "positional";
  }
  props["dicom.photometric-interpretation"] = base.photometric;
  props["dicom.manufacturer"] = text(base.dataset, DCM_Manufacturer);
  props["dicom.software-versions"] = text(base.dataset, DCM_SoftwareVersions);
  props["dicom.image-orientation-slide"] = "";
  for (unsigned long k = 0; k < 6; ++k) {
    const std::string v = text(base.dataset, DCM_ImageOrientationSlide, k);
    if (v.empty()) break;
    append(props["dicom.image-orientation-slide"], "\\", v);
  }
  DcmItem* origin = sequence_item(base.dataset, DCM_TotalPixelMatrixOriginSequence);
  if (origin != nullptr) {
    props["dicom.origin-x-mm"] = text(origin, DCM_XOffsetInSlideCoordinateSystem);
    props["dicom.origin-y-mm"] = text(origin, DCM_YOffsetInSlideCoordinateSystem);
  }
  std::string paths;
  for (const auto& p : base.optical_paths) append(paths, "\\", p);
  props["dicom.optical-paths"] = paths;
  props["dicom.focal-planes"] = std::to_string(base.focal_planes);
  props["dicom.icc-profile-bytes"] = std::to_string(base.icc_profile.size());
  impl->icc_profile = base.icc_profile;
  const std::string software = text(base.dataset, DCM_SoftwareVersions);
  if (!software.empty()) props["tiff.Software"] = software;  // the provenance marker's place (io/provenance.h)
  return std::unique_ptr<DicomSlide>(new DicomSlide(std::move(impl)));
}

const std::string& DicomSlide::id() const { return impl_->id; }
const std::vector<DicomSlide::Level>& DicomSlide::levels() const { return impl_->levels; }
const std::vector<DicomSlide::Associated>& DicomSlide::associated() const { return impl_->associated; }
std::optional<double> DicomSlide::mpp_x() const { return impl_->mpp_x; }
std::optional<double> DicomSlide::mpp_y() const { return impl_->mpp_y; }
const std::string& DicomSlide::mpp_origin() const { return impl_->mpp_origin; }
const std::map<std::string, std::string>& DicomSlide::properties() const { return impl_->properties; }
const std::vector<std::string>& DicomSlide::notes() const { return impl_->notes; }
const std::string& DicomSlide::description() const { return impl_->description; }
std::size_t DicomSlide::cached_bytes() const { return impl_->cache.bytes(); }
const std::string& DicomSlide::icc_profile() const { return impl_->icc_profile; }

cv::Mat DicomSlide::read(int level, std::int64_t lx, std::int64_t ly, int width, int height) const {
  if (level < 0 || level >= static_cast<int>(impl_->levels.size()) || width <= 0 || height <= 0) {
    throw core::InternalError(
        fmt::format("DICOM read of level {}, {}x{} pixels: invalid request", level, width, height));
  }
  return impl_->read(static_cast<std::size_t>(level), lx, ly, width, height);
}

cv::Mat DicomSlide::read_associated(const std::string& name) const {
  for (std::size_t i = 0; i < impl_->associated.size(); ++i) {
    const Associated& a = impl_->associated[i];
    if (a.name == name) {
      return impl_->read(impl_->levels.size() + i, 0, 0, static_cast<int>(a.width), static_cast<int>(a.height));
    }
  }
  throw core::InternalError("no associated DICOM image '" + name + "'");
}

}  // namespace tessera::io
