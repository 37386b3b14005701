#include "io/image.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::io {

namespace {

constexpr std::string_view kPngSignature("\x89PNG\r\n\x1a\n", 8);
constexpr std::size_t kChunkOverhead = 12;  // length, type, CRC
constexpr std::size_t kIhdrDataSize = 13;   // IHDR, always the first chunk, has 13 bytes of data
constexpr std::size_t kMaxKeyword = 79;

// PNG's CRC-32 (ISO 3309, polynomial 0xEDB88320) over a chunk's type and data.
std::uint32_t crc32(std::string_view bytes) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1U) != 0 ? 0xEDB88320U ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFU;
  for (const char byte : bytes) c = table[(c ^ static_cast<std::uint8_t>(byte)) & 0xFFU] ^ (c >> 8);
  return c ^ 0xFFFFFFFFU;
}

void put_u32(std::string& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((value >> shift) & 0xFFU));
}

std::uint32_t get_u32(std::string_view bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t k = 0; k < 4; ++k) value = (value << 8) | static_cast<std::uint8_t>(bytes[at + k]);
  return value;
}

// An iTXt chunk: keyword, NUL, compression flag 0, method 0, empty language tag and translated keyword, the text.
std::string itxt_chunk(const PngText& entry, const std::string& path) {
  const bool printable =
      std::all_of(entry.keyword.begin(), entry.keyword.end(), [](char c) { return c >= ' ' && c <= '~'; });
  if (entry.keyword.empty() || entry.keyword.size() > kMaxKeyword || !printable || entry.keyword.front() == ' ' ||
      entry.keyword.back() == ' ') {
    throw core::InternalError("write_png: invalid text keyword '" + entry.keyword + "' for '" + path + "'");
  }
  std::string body = "iTXt" + entry.keyword;
  body += std::string("\0\0\0\0\0", 5);
  body += entry.text;
  std::string chunk;
  put_u32(chunk, static_cast<std::uint32_t>(body.size() - 4));
  chunk += body;
  put_u32(chunk, crc32(body));
  return chunk;
}

}  // namespace

void write_png(const std::string& path, const cv::Mat& rgb, const std::vector<PngText>& text) {
  cv::Mat bgr;
  if (rgb.type() == CV_8UC3) {
    cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  } else if (rgb.type() == CV_8UC4) {
    cv::cvtColor(rgb, bgr, cv::COLOR_RGBA2BGRA);
  } else {
    throw core::InternalError("write_png: expected an 8-bit RGB or RGBA image for '" + path + "'");
  }
  std::vector<unsigned char> bytes;
  if (!cv::imencode(".png", bgr, bytes)) throw core::InternalError("cannot encode PNG '" + path + "'");
  std::string png(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (!text.empty()) {
    // After the signature and IHDR, before the image data.
    const std::size_t after_header = kPngSignature.size() + kChunkOverhead + kIhdrDataSize;
    std::string chunks;
    for (const auto& entry : text) chunks += itxt_chunk(entry, path);
    png.insert(after_header, chunks);
  }
  core::write_file_atomic(path, png);
}

std::map<std::string, std::string> read_png_text(const std::string& path) {
  if (!std::filesystem::exists(path)) throw core::FileNotFoundError(path);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && in.fail()) throw core::InputError("cannot read", path);
  if (!std::string_view(bytes).starts_with(kPngSignature)) throw core::InputError("not a PNG file", path);
  std::map<std::string, std::string> text;
  std::size_t at = kPngSignature.size();
  while (at < bytes.size()) {
    if (bytes.size() - at < kChunkOverhead) throw core::InputError("a PNG chunk is cut short", path);
    const std::uint32_t length = get_u32(bytes, at);
    if (length > bytes.size() - at - kChunkOverhead) throw core::InputError("a PNG chunk is cut short", path);
    const std::string type = bytes.substr(at + 4, 4);
    const std::string data = bytes.substr(at + 8, length);
    at += kChunkOverhead + length;
    if (type == "IEND") break;
    const std::size_t nul = data.find('\0');
    if (nul == std::string::npos) continue;
    const std::string keyword = data.substr(0, nul);
    if (type == "tEXt") {
      text.emplace(keyword, data.substr(nul + 1));
    } else if (type == "iTXt") {
      // Compression flag, method, language tag NUL, translated keyword NUL, text; compressed text is skipped.
      if (data.size() < nul + 3 || data[nul + 1] != '\0') continue;
      const std::size_t language_end = data.find('\0', nul + 3);
      if (language_end == std::string::npos) continue;
      const std::size_t translated_end = data.find('\0', language_end + 1);
      if (translated_end == std::string::npos) continue;
      text.emplace(keyword, data.substr(translated_end + 1));
    }
  }
  return text;
}

namespace {

// libjpeg's error manager, made strict: an error ends the decode (longjmp back), and the first warning ("Premature
// end of JPEG file", "Corrupt JPEG data: N extraneous bytes") is kept, because with a warning libjpeg fills what it
// could not decode with grey and returns it as pixels.
struct StrictJpegErrors {
  jpeg_error_mgr manager{};
  std::jmp_buf jump{};
  std::string first;
};

void keep_message(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<StrictJpegErrors*>(cinfo->err);
  if (!errors->first.empty()) return;
  char text[JMSG_LENGTH_MAX] = {};
  (*cinfo->err->format_message)(cinfo, text);
  errors->first = text;
}

void jpeg_fails(j_common_ptr cinfo) {
  keep_message(cinfo);
  std::longjmp(reinterpret_cast<StrictJpegErrors*>(cinfo->err)->jump, 1);
}

void jpeg_warns(j_common_ptr cinfo, int level) {
  if (level < 0) keep_message(cinfo);  // level 0+ are trace messages
}

// Decodes `bytes` into `rgb` (owned by the caller: nothing with a destructor lives in this frame, which longjmp
// returns to); false after an error, with its message in `errors`.
bool decode_jpeg(const std::vector<unsigned char>& bytes, StrictJpegErrors& errors, cv::Mat& rgb) {
  jpeg_decompress_struct cinfo{};
  cinfo.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_fails;
  errors.manager.emit_message = jpeg_warns;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  rgb.create(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width), CV_8UC3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = rgb.ptr(static_cast<int>(cinfo.output_scanline));
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// A JPEG file as RGB; InputError naming the file on any error or warning.
cv::Mat read_jpeg_strict(const std::string& path, const std::vector<unsigned char>& bytes) {
  StrictJpegErrors errors;
  cv::Mat rgb;
  if (!decode_jpeg(bytes, errors, rgb) || !errors.first.empty()) {
    throw core::InputError("damaged JPEG data (" + errors.first + ")", path);
  }
  return rgb;
}

}  // namespace

cv::Mat read_rgb_image(const std::string& path) { return decode_rgb_image(read_file_bytes(path), path); }

std::vector<unsigned char> read_file_bytes(const std::string& path) {
  if (!std::filesystem::exists(path)) throw core::FileNotFoundError(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError("cannot be read", path);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes;
}

cv::Mat decode_rgb_image(const std::vector<unsigned char>& bytes, const std::string& path) {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return read_jpeg_strict(path, bytes);
  // Other formats through OpenCV, whose PNG decoder already fails (empty image) on a truncated file or a bad CRC.
  cv::Mat bgr = cv::imdecode(bytes, cv::IMREAD_COLOR);
  if (bgr.empty()) throw core::InputError("cannot decode image", path);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

}  // namespace tessera::io
