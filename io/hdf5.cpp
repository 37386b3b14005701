#include "io/hdf5.h"
#include "io/hdf5_library.h"

#include <cstdlib>
#include <cstring>

namespace tessera::io::hdf5 {
namespace {

herr_t collect_error(unsigned depth, const H5E_error2_t* entry, void* data) {
  auto* failure = static_cast<Failure*>(data);
  const std::string desc = entry->desc != nullptr ? entry->desc : "";
  if (depth == 0) failure->api = desc;
  if (!desc.empty()) failure->detail = desc;
  // The _g variable, not the H5E_TRUNCATED macro: the macro calls H5open(), an API call inside the walk.
  if (entry->min_num == H5E_TRUNCATED_g) failure->truncated = desc;
  // A failing system call is recorded as "..., errno = 28, error message = 'No space left on device', ...".
  if (const auto at = desc.find("errno = "); at != std::string::npos && failure->system_error == 0) {
    failure->system_error = std::atoi(desc.c_str() + at + std::strlen("errno = "));
  }
  return 0;
}

}  // namespace

Failure last_failure() {
  Failure failure;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &failure);
  return failure;
}

Handle make_file_access(const Hdf5Checker& h5) {
  Handle fapl = h5.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access list");
#if H5_VERSION_GE(1, 10, 7)
  h5.check(H5Pset_file_locking(fapl.get(), true, true), "cannot set file locking");
#endif
  return fapl;
}

Handle utf8_string_type(const Hdf5Checker& h5, const std::string& what) {
  Handle type = h5.own(H5Tcopy(H5T_C_S1), H5Tclose, what);
  h5.check(H5Tset_size(type.get(), H5T_VARIABLE), what);
  h5.check(H5Tset_cset(type.get(), H5T_CSET_UTF8), what);
  return type;
}

std::string describe_dims(const std::vector<hsize_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

std::string attribute_label(const std::string& name, const std::string& where) {
  std::string label = "attribute '" + name + "'";
  if (!where.empty()) label.append(" in ").append(where);
  return label;
}

namespace {

// A scalar dataspace, or a simple one of shape `dims`.
Handle make_space(const Hdf5Checker& h5, const std::vector<hsize_t>& dims, const std::string& what) {
  if (dims.empty()) return h5.own(H5Screate(H5S_SCALAR), H5Sclose, what);
  return h5.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, what);
}

Handle create_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, hid_t file_type,
                        const hsize_t* count, const std::string& what) {
  Handle space = count == nullptr ? make_space(h5, {}, what) : make_space(h5, {*count}, what);
  return h5.own(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, what);
}

std::string write_what(const std::string& name) { return "cannot write attribute '" + name + "'"; }

}  // namespace

namespace detail {

void write_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                     const void* data, const hsize_t* count) {
  const std::string what = write_what(name);
  Handle attribute = create_attribute(h5, object, name, file_type, count, what);
  if (count == nullptr || *count > 0) h5.check(H5Awrite(attribute.get(), memory_type, data), what);
  h5.close(attribute, what);
}

void write_string_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name,
                            const std::vector<const char*>& data, bool scalar) {
  const std::string what = write_what(name);
  Handle type = utf8_string_type(h5, what);
  const hsize_t count = data.size();
  Handle attribute = create_attribute(h5, object, name, type.get(), scalar ? nullptr : &count, what);
  if (!data.empty()) h5.check(H5Awrite(attribute.get(), type.get(), data.data()), what);
  h5.close(attribute, what);
}

}  // namespace detail

bool has_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name) {
  return h5.check(H5Aexists(object, name.c_str()), "cannot look up attribute '" + name + "'") > 0;
}

Attribute open_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, const std::string& where) {
  Attribute a;
  a.label = attribute_label(name, where);
  if (!has_attribute(h5, object, name)) h5.fail("missing " + a.label);
  const std::string what = "cannot read " + a.label;
  a.attribute = h5.own(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose, what);
  a.type = h5.own(H5Aget_type(a.attribute.get()), H5Tclose, what);
  a.type_class = h5.check(H5Tget_class(a.type.get()), what);
  Handle space = h5.own(H5Aget_space(a.attribute.get()), H5Sclose, what);
  a.space_class = h5.check(H5Sget_simple_extent_type(space.get()), what);
  const int rank = h5.check(H5Sget_simple_extent_ndims(space.get()), what);
  a.dims.resize(static_cast<std::size_t>(rank));
  if (rank > 0) h5.check(H5Sget_simple_extent_dims(space.get(), a.dims.data(), nullptr), what);
  a.size = static_cast<std::size_t>(h5.check(H5Sget_simple_extent_npoints(space.get()), what));
  return a;
}

namespace {

// Strings stored as an array of `count` elements of `type`, variable- or fixed-length. `read` reads them into
// the buffer it is given, in `type`; `reclaim` frees what a variable-length read allocated.
template <typename Read, typename Reclaim>
std::vector<std::string> read_strings(const Hdf5Checker& h5, hid_t type, std::size_t count, const std::string& what,
                                      Read read, Reclaim reclaim) {
  std::vector<std::string> values;
  if (count == 0) return values;
  values.reserve(count);
  if (h5.check(H5Tis_variable_str(type), what) > 0) {
    std::vector<char*> data(count, nullptr);
    h5.check(read(data.data()), what);
    for (char* s : data) values.emplace_back(s != nullptr ? s : "");
    h5.check(reclaim(data.data()), what);
    return values;
  }
  const std::size_t size = H5Tget_size(type);
  if (size == 0) h5.fail(what);
  std::vector<char> data(count * size, '\0');
  h5.check(read(data.data()), what);
  for (std::size_t i = 0; i < count; ++i) {
    const char* s = data.data() + i * size;
    values.emplace_back(s, strnlen(s, size));
  }
  return values;
}

// What a read of T requires of the stored type, as the messages say it.
template <typename T>
bool holds(H5T_class_t type_class) {
  if constexpr (std::same_as<T, std::string>) return type_class == H5T_STRING;
  if constexpr (std::same_as<T, double>) return type_class == H5T_FLOAT || type_class == H5T_INTEGER;
  return type_class == H5T_INTEGER;
}
template <typename T>
const char* one_of() {
  if constexpr (std::same_as<T, std::string>) return "a string";
  if constexpr (std::same_as<T, double>) return "a number";
  return "an integer";
}
template <typename T>
const char* list_of() {
  if constexpr (std::same_as<T, std::string>) return "strings";
  if constexpr (std::same_as<T, double>) return "numbers";
  return "integers";
}

}  // namespace

template <typename T>
std::vector<T> read_values(const Hdf5Checker& h5, const Attribute& a) {
  const std::string what = "cannot read " + a.label;
  if constexpr (std::same_as<T, std::string>) {
    const hid_t type = a.type.get();
    return read_strings(
        h5, type, a.size, what, [&](void* buffer) { return H5Aread(a.attribute.get(), type, buffer); },
        [&](void* buffer) {
          Handle space = h5.own(H5Aget_space(a.attribute.get()), H5Sclose, what);
          return H5Dvlen_reclaim(type, space.get(), H5P_DEFAULT, buffer);
        });
  } else {
    std::vector<T> values(a.size);
    if (!values.empty()) h5.check(H5Aread(a.attribute.get(), NumberType<T>::memory(), values.data()), what);
    return values;
  }
}

template std::vector<std::string> read_values(const Hdf5Checker&, const Attribute&);
template std::vector<std::int64_t> read_values(const Hdf5Checker&, const Attribute&);
template std::vector<std::uint64_t> read_values(const Hdf5Checker&, const Attribute&);
template std::vector<double> read_values(const Hdf5Checker&, const Attribute&);

template <typename T>
T read_attribute(const Hdf5Checker& h5, hid_t object, const std::string& name, const std::string& where) {
  const Attribute a = open_attribute(h5, object, name, where);
  if constexpr (IsVector<T>::value) {
    using V = typename T::value_type;
    if (!holds<V>(a.type_class) || a.dims.size() > 1) h5.fail(a.label + " must be a list of " + list_of<V>());
    return read_values<V>(h5, a);
  } else {
    if (a.size != 1) h5.fail(a.label + " must be a single value");
    if (!holds<T>(a.type_class)) h5.fail(a.label + " must be " + one_of<T>());
    return read_values<T>(h5, a).front();
  }
}

template std::string read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::int64_t read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::uint64_t read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template double read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::vector<std::string> read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::vector<std::int64_t> read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::vector<std::uint64_t> read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);
template std::vector<double> read_attribute(const Hdf5Checker&, hid_t, const std::string&, const std::string&);

// ---------------------------------------------------------------------------------------------------------
// Datasets

template <Scalar T>
Handle create_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name, const std::vector<hsize_t>& dims,
                      const DatasetOptions& options, const std::string& what_given) {
  const std::string what = what_given.empty() ? "cannot create dataset '" + name + "'" : what_given;
  Handle string_type;
  hid_t file_type = H5I_INVALID_HID;
  if constexpr (std::same_as<T, std::string>) {
    string_type = utf8_string_type(h5, what);
    file_type = string_type.get();
  } else {
    file_type = NumberType<T>::file();
  }
  Handle space = make_space(h5, dims, what);
  Handle dcpl = h5.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, what);
  if (!options.track_times) h5.check(H5Pset_obj_track_times(dcpl.get(), false), what);
  h5.check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), what);
  if (options.allocation == DatasetOptions::Allocation::early_unfilled) {
    h5.check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), what);
    h5.check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), what);
  } else {
    h5.check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_LATE), what);
  }
  return h5.own(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                H5Dclose, what);
}

template <Scalar T>
void write_dataset(const Hdf5Checker& h5, const Handle& dataset, const std::vector<T>& values,
                   const std::string& what) {
  if (values.empty()) return;
  if constexpr (std::same_as<T, std::string>) {
    Handle type = utf8_string_type(h5, what);
    std::vector<const char*> data;
    data.reserve(values.size());
    for (const auto& v : values) data.push_back(v.c_str());
    h5.check(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), what);
  } else {
    h5.check(H5Dwrite(dataset.get(), NumberType<T>::memory(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), what);
  }
}

std::uint64_t Dataset::size() const {
  std::uint64_t n = 1;
  for (const hsize_t d : dims) n *= d;
  return n;
}

bool has_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name) {
  return h5.check(H5Lexists(parent, name.c_str(), H5P_DEFAULT), "cannot look up dataset '" + name + "'") > 0;
}

Dataset open_dataset(const Hdf5Checker& h5, hid_t parent, const std::string& name, const std::string& what_given) {
  const std::string what = what_given.empty() ? "cannot open dataset '" + name + "'" : what_given;
  if (h5.check(H5Lexists(parent, name.c_str(), H5P_DEFAULT), what) == 0) h5.fail("missing dataset '" + name + "'");
  Dataset d;
  d.name = name;
  d.dataset = h5.own(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose, what);
  d.type = h5.own(H5Dget_type(d.dataset.get()), H5Tclose, what);
  d.type_class = h5.check(H5Tget_class(d.type.get()), what);
  Handle space = h5.own(H5Dget_space(d.dataset.get()), H5Sclose, what);
  const int rank = h5.check(H5Sget_simple_extent_ndims(space.get()), what);
  d.dims.resize(static_cast<std::size_t>(rank));
  if (rank > 0) h5.check(H5Sget_simple_extent_dims(space.get(), d.dims.data(), nullptr), what);
  return d;
}

void expect_class(const Hdf5Checker& h5, const Dataset& dataset, H5T_class_t expected, const std::string& described) {
  if (dataset.type_class != expected) h5.fail("dataset '" + dataset.name + "' must hold " + described);
}

void expect_shape(const Hdf5Checker& h5, const Dataset& dataset, const std::vector<hsize_t>& expected) {
  if (dataset.dims != expected) {
    h5.fail("dataset '" + dataset.name + "' has shape " + describe_dims(dataset.dims) + ", expected " +
            describe_dims(expected));
  }
}

template <Scalar T>
std::vector<T> read_dataset(const Hdf5Checker& h5, const Dataset& d, const std::string& what_given) {
  const std::string what = what_given.empty() ? "cannot read dataset '" + d.name + "'" : what_given;
  const auto count = static_cast<std::size_t>(d.size());
  if constexpr (std::same_as<T, std::string>) {
    const hid_t type = d.type.get();
    const hid_t id = d.dataset.get();
    return read_strings(
        h5, type, count, what, [&](void* buffer) { return H5Dread(id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer); },
        [&](void* buffer) {
          Handle space = h5.own(H5Dget_space(id), H5Sclose, what);
          return H5Dvlen_reclaim(type, space.get(), H5P_DEFAULT, buffer);
        });
  } else {
    std::vector<T> values(count);
    if (!values.empty()) {
      h5.check(H5Dread(d.dataset.get(), NumberType<T>::memory(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), what);
    }
    return values;
  }
}

#define TESSERA_HDF5_DATASET_TYPE(T)                                                                            \
  template Handle create_dataset<T>(const Hdf5Checker&, hid_t, const std::string&, const std::vector<hsize_t>&, \
                                    const DatasetOptions&, const std::string&);                                 \
  template void write_dataset<T>(const Hdf5Checker&, const Handle&, const std::vector<T>&, const std::string&); \
  template std::vector<T> read_dataset<T>(const Hdf5Checker&, const Dataset&, const std::string&);
TESSERA_HDF5_DATASET_TYPE(std::uint8_t)
TESSERA_HDF5_DATASET_TYPE(std::uint16_t)
TESSERA_HDF5_DATASET_TYPE(std::uint32_t)
TESSERA_HDF5_DATASET_TYPE(std::int32_t)
TESSERA_HDF5_DATASET_TYPE(std::int64_t)
TESSERA_HDF5_DATASET_TYPE(std::uint64_t)
TESSERA_HDF5_DATASET_TYPE(float)
TESSERA_HDF5_DATASET_TYPE(double)
TESSERA_HDF5_DATASET_TYPE(std::string)
#undef TESSERA_HDF5_DATASET_TYPE

}  // namespace tessera::io::hdf5

namespace tessera::io {

void skip_hdf5_exit_cleanup() { H5dont_atexit(); }

}  // namespace tessera::io
