// Writing RGB images for people to look at (previews, overlays, plots).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

// A text entry of a PNG (an iTXt chunk): a keyword of 1-79 printable ASCII characters (PNG's registered ones include
// Title, Description, Warning, Comment) and UTF-8 text, which image viewers and `exiftool` show.
struct PngText {
  std::string keyword;
  std::string text;
};

// Writes an RGB (CV_8UC3) or RGBA (CV_8UC4) image as PNG, atomically and durably (core/atomic_file.h), with `text` as
// iTXt chunks right after the header. core::InternalError naming the file when encoding or writing fails or a
// keyword is not valid.
void write_png(const std::string& path, const cv::Mat& rgb, const std::vector<PngText>& text = {});

// The uncompressed text entries (tEXt, iTXt) of a PNG file, keyword → text (a keyword seen twice keeps its first
// text). core::InputError naming the file when it is not a PNG or its chunks are cut short.
std::map<std::string, std::string> read_png_text(const std::string& path);

// Reads a PNG/JPEG/TIFF image as RGB CV_8UC3; core::InputError naming the file when it cannot be decoded.
cv::Mat read_rgb_image(const std::string& path);

// The two halves of read_rgb_image, for a caller that also needs the file's bytes (e.g. to hash the very bytes it
// decodes): the bytes of `path` (core::FileNotFoundError or InputError naming it), and those bytes decoded as
// read_rgb_image does, with errors naming `path`.
std::vector<unsigned char> read_file_bytes(const std::string& path);
cv::Mat decode_rgb_image(const std::vector<unsigned char>& bytes, const std::string& path);

}  // namespace tessera::io
