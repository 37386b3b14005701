#include "io/imgcodecs.h"

#include <dlfcn.h>

#include <type_traits>

#include "core/error.h"

namespace tessera::io::imgcodecs {
namespace {

// The functions' types, checked against OpenCV's declarations (unevaluated: no reference to the library).
using Imread = decltype(&cv::imread);
using Imwrite = decltype(&cv::imwrite);
using Imencode = decltype(&cv::imencode);
using Imdecode = cv::Mat (*)(cv::InputArray, int);
static_assert(std::is_same_v<decltype(static_cast<Imdecode>(&cv::imdecode)), Imdecode>);

struct Codecs {
  Imread imread;
  Imwrite imwrite;
  Imencode imencode;
  Imdecode imdecode;
};

// The library is loaded once and stays (its functions are called until the process ends). The symbol names are
// the Itanium C++ ABI's for the declarations above, as g++ and clang++ mangle them on Linux (std::string is
// std::__cxx11::basic_string).
const Codecs& codecs() {
  static const Codecs loaded = [] {
    void* library = ::dlopen(TESSERA_OPENCV_IMGCODECS, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = ::dlerror();
      throw core::InternalError(std::string("cannot load OpenCV's image codecs (") + TESSERA_OPENCV_IMGCODECS +
                                "): " + (why != nullptr ? why : "unknown error"));
    }
    const auto symbol = [&](const char* name) {
      void* address = ::dlsym(library, name);
      if (address == nullptr) {
        throw core::InternalError(std::string("OpenCV's image codecs (") + TESSERA_OPENCV_IMGCODECS + ") have no " +
                                  name);
      }
      return address;
    };
    return Codecs{
        reinterpret_cast<Imread>(symbol("_ZN2cv6imreadERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEi")),
        reinterpret_cast<Imwrite>(symbol("_ZN2cv7imwriteERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKNS_"
                                         "11_InputArrayERKSt6vectorIiSaIiEE")),
        reinterpret_cast<Imencode>(symbol("_ZN2cv8imencodeERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKNS_"
                                          "11_InputArrayERSt6vectorIhSaIhEERKSB_IiSaIiEE")),
        reinterpret_cast<Imdecode>(symbol("_ZN2cv8imdecodeERKNS_11_InputArrayEi")),
    };
  }();
  return loaded;
}

}  // namespace

cv::Mat imread(const std::string& path, int flags) { return codecs().imread(path, flags); }

bool imwrite(const std::string& path, cv::InputArray image, const std::vector<int>& params) {
  return codecs().imwrite(path, image, params);
}

bool imencode(const std::string& extension, cv::InputArray image, std::vector<uchar>& bytes,
              const std::vector<int>& params) {
  return codecs().imencode(extension, image, bytes, params);
}

cv::Mat imdecode(cv::InputArray bytes, int flags) { return codecs().imdecode(bytes, flags); }

}  // namespace tessera::io::imgcodecs
