// HDF5 plumbing shared by the shard, heatmap and checkpoint code (internal to tessera_io): RAII ids, a quiet
// error stack, the text of the last failure, checks that turn a failing call into the right Tessera error, and one
// typed API for the attributes and datasets those files hold.
#pragma once

#include <hdf5.h>

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
  virtual ~Hdf5Checker() = default;
  Hdf5Checker(const Hdf5Checker&) = default;
  Hdf5Checker& operator=(const Hdf5Checker&) = default;

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

  const std::string& file() const { return file_; }

 protected:
  // The text of the error for `message`. A reader with more to say about every refusal (a truncated checkpoint
  // says so whatever else went wrong) overrides it.
  virtual std::string error_text(const std::string& message) const { return message; }

 private:
  [[noreturn]] void throw_error(const std::string& message) const {
    if (kind_ == core::ErrorKind::input) throw core::InputError(error_text(message), file_);
    core::InternalError error(error_text(message));
    error.add_context("file", file_);
    throw error;
  }

  std::string file_;
  core::ErrorKind kind_;
};

// ---------------------------------------------------------------------------------------------------------
// Typed attributes and datasets.
//
// The C++ type of a value is the type it is stored as, little-endian as h5py and numpy write it:
//   std::string    variable-length UTF-8 string     float          float32
//   std::uint8_t   uint8                            double         float64
//   std::uint16_t  uint16
//   std::uint32_t  uint32                           std::int32_t   int32
//   std::int64_t   int64                            std::uint64_t  uint64
// An attribute is a scalar, or a one-dimensional array for a std::vector of these. The writers name the stored
// type as a template argument (write_attribute<std::int64_t>(h5, object, "rows", rows)) and convert the value to
// it, so an `int` never lands in a file as int32 by accident.
//
// Messages name an attribute "attribute 'name'", or "attribute 'name' in <where>" when `where` is given
// ("/meta"). Every failing HDF5 call goes through the checker: reading someone's file gives a core::InputError
// naming it, writing ours a core::InternalError with the file as context. The reading checks, in order:
//   missing                       "missing attribute 'x'"
//   not one value (a scalar read) "attribute 'x' must be a single value"
//   wrong type class              "attribute 'x' must be a string" / "an integer" / "a number" (float or integer)
//   not a list (a vector read)    "attribute 'x' must be a list of strings" / "integers" / "numbers"

// The stored (file) type and the in-memory type of each number type.
template <typename T>
struct NumberType;
template <>
struct NumberType<std::uint8_t> {
  static hid_t file() { return H5T_STD_U8LE; }
  static hid_t memory() { return H5T_NATIVE_UINT8; }
};
template <>
struct NumberType<std::uint16_t> {
  static hid_t file() { return H5T_STD_U16LE; }
  static hid_t memory() { return H5T_NATIVE_UINT16; }
};
template <>
struct NumberType<std::uint32_t> {
  static hid_t file() { return H5T_STD_U32LE; }
  static hid_t memory() { return H5T_NATIVE_UINT32; }
};
template <>
struct NumberType<std::int32_t> {
  static hid_t file() { return H5T_STD_I32LE; }
  static hid_t memory() { return H5T_NATIVE_INT32; }
};
template <>
struct NumberType<std::int64_t> {
  static hid_t file() { return H5T_STD_I64LE; }
  static hid_t memory() { return H5T_NATIVE_INT64; }
};
template <>
struct NumberType<std::uint64_t> {
  static hid_t file() { return H5T_STD_U64LE; }
  static hid_t memory() { return H5T_NATIVE_UINT64; }
};
template <>
struct NumberType<float> {
  static hid_t file() { return H5T_IEEE_F32LE; }
  static hid_t memory() { return H5T_NATIVE_FLOAT; }
};
template <>
struct NumberType<double> {
  static hid_t file() { return H5T_IEEE_F64LE; }
  static hid_t memory() { return H5T_NATIVE_DOUBLE; }
};

template <typename T>
concept Number = requires {
  { NumberType<T>::file() } -> std::same_as<hid_t>;
};

// A value an attribute or a dataset element can hold.
template <typename T>
concept Scalar = Number<T> || std::same_as<T, std::string>;

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
concept ScalarVector = IsVector<T>::value && Scalar<typename T::value_type>;

// A whole attribute: a scalar, or a one-dimensional array of scalars.
template <typename T>
concept AttributeValue = Scalar<T> || ScalarVector<T>;

// A file access list for opening or creating a file: HDF5's file lock is kept, but a file system without locks
// (some cluster file systems) is not an error.
Handle make_file_access(const Hdf5Checker& h5);

// A variable-length UTF-8 string type (the string type of every file Tessera writes); `what` says what fails.
Handle utf8_string_type(const Hdf5Checker& h5, const std::string& what);

// "[2, 3, 4]"
std::string describe_dims(const std::vector<hsize_t>& dims);

// "attribute 'name'", or "attribute 'name' in <where>".
std::string attribute_label(const std::string& name, const std::string& where = {});

// --- Writing attributes --------------------------------------------------------------------------------------

namespace detail {
// `count`: nullptr for a scalar, else the length of a one-dimensional array (no data is written when it is 0).
void write_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                     const void* data, const hsize_t* count);
void write_string_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name,
                            const std::vector<const char*>& data, bool scalar);
}  // namespace detail

// Creates attribute `name` on `object` (a file, group or dataset) holding `value` as T (see above). Every failure
// is "cannot write attribute 'name'".
template <AttributeValue T>
void write_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name,
                     const std::type_identity_t<T>& value) {
  if constexpr (std::same_as<T, std::string>) {
    detail::write_string_attribute(h5, object, name, {value.c_str()}, true);
  } else if constexpr (Number<T>) {
    detail::write_attribute(h5, object, name, NumberType<T>::file(), NumberType<T>::memory(), &value, nullptr);
  } else if constexpr (std::same_as<typename T::value_type, std::string>) {
    std::vector<const char*> data;
    data.reserve(value.size());
    for (const auto& v : value) data.push_back(v.c_str());
    detail::write_string_attribute(h5, object, name, data, false);
  } else {
    using V = typename T::value_type;
    const hsize_t count = value.size();
    detail::write_attribute(h5, object, name, NumberType<V>::file(), NumberType<V>::memory(), value.data(), &count);
  }
}

// --- Reading attributes --------------------------------------------------------------------------------------

// Whether `object` has attribute `name` ("cannot look up attribute 'name'" when HDF5 cannot tell).
bool has_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name);

// An open attribute and what its type and dataspace are, for readers that decide by the stored type (a
// checkpoint's /state). Failing calls are "cannot read <label>".
struct Attribute {
  Handle attribute;
  Handle type;
  H5T_class_t type_class = H5T_NO_CLASS;
  H5S_class_t space_class = H5S_NO_CLASS;  // H5S_SCALAR, H5S_SIMPLE or H5S_NULL
  std::vector<hsize_t> dims;               // empty for a scalar
  std::size_t size = 0;                    // number of values (1 for a scalar, 0 for a null dataspace)
  std::string label;                       // "attribute 'x'" or "attribute 'x' in /meta"
};

// Opens attribute `name` of `object`; a missing one is "missing <label>".
Attribute open_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, const std::string& where = {});

// All values of an open attribute, converted to T (std::string, std::int64_t, std::uint64_t or double) as HDF5
// converts them; the caller has checked the type class. Strings may be variable- or fixed-length, ASCII or UTF-8.
template <typename T>
std::vector<T> read_values(const Hdf5Checker& h5, const Attribute& attribute);

// The value of attribute `name` of `object`, checked as listed above. T: std::string, std::int64_t or
// std::uint64_t (an integer attribute), double (an integer or floating-point attribute), or a std::vector of one
// of these (a scalar or a one-dimensional attribute).
template <typename T>
T read_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, const std::string& where = {});

// --- Datasets ------------------------------------------------------------------------------------------------

// How a new dataset is stored. Every dataset Tessera writes is contiguous: what h5py and numpy read directly, and
// what lets shard tiles be read with pread at the dataset's file offset.
struct DatasetOptions {
  enum class Allocation {
    late,           // at the first write, as HDF5 does by default
    early_unfilled  // when the dataset is created, and never pre-filled: the file offset exists from the start
  };
  Allocation allocation = Allocation::late;
  // Modification times in the object header (HDF5's default); off where the same content must give the same bytes.
  bool track_times = true;
};

// Creates dataset `name` in `parent` holding T (see above) with shape `dims` (empty: a scalar). Every failure is
// `what`, by default "cannot create dataset 'name'".
template <Scalar T>
Handle create_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name, const std::vector<hsize_t>& dims,
                      const DatasetOptions& options = {}, const std::string& what = {});

// Writes all of `dataset` from `values` (one per element, C order); nothing when `values` is empty.
template <Scalar T>
void write_dataset(const Hdf5Checker& h5, const Handle& dataset, const std::vector<T>& values, const std::string& what);

// An open dataset with its type and shape.
struct Dataset {
  std::string name;  // as given to open_dataset(); messages say "dataset '<name>'"
  Handle dataset;
  Handle type;
  H5T_class_t type_class = H5T_NO_CLASS;
  std::vector<hsize_t> dims;   // empty for a scalar
  std::uint64_t size() const;  // number of elements
};

// Whether `parent` has a link `name` ("cannot look up dataset 'name'" when HDF5 cannot tell).
bool has_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name);

// Opens dataset `name` in `parent`: a missing one is "missing dataset 'name'", a failing call `what` (by default
// "cannot open dataset 'name'").
Dataset open_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name, const std::string& what = {});

// "dataset 'x' must hold <described>" unless the dataset's type is of class `expected`.
void expect_class(const Hdf5Checker& h5, const Dataset& dataset, H5T_class_t expected, const std::string& described);
// "dataset 'x' has shape [..], expected [..]" unless the dataset has shape `expected`.
void expect_shape(const Hdf5Checker& h5, const Dataset& dataset, const std::vector<hsize_t>& expected);

// All elements of `dataset` (C order), converted to T as HDF5 converts them; the caller has checked the type
// class and the shape. A failing read is `what`, by default "cannot read dataset 'name'".
template <Scalar T>
std::vector<T> read_dataset(const Hdf5Checker& h5, const Dataset& dataset, const std::string& what = {});

}  // namespace tessera::io::hdf5
