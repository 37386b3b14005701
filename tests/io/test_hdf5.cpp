// io/hdf5.h: the typed attribute and dataset helpers the shard, heatmap and checkpoint code share. Round trips of
// every type with the stored type checked as plain HDF5 sees it, the layouts a new dataset gets, and the errors:
// a refusal of someone's file is a core::InputError naming the file, a failing write of ours a
// core::InternalError with the file as context.
#include "io/hdf5.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::io::hdf5 {
namespace {

using testing::TempDir;

// A new HDF5 file, open for writing, with checkers for reading it (input) and writing it (internal).
class Hdf5File : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("test.h5");
    file_ = Handle(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file_.valid());
  }
  void TearDown() override { EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), file_.valid() ? 1 : 0); }

  hid_t file() const { return file_.get(); }
  const Hdf5Checker& reading() const { return reading_; }
  const Hdf5Checker& writing() const { return writing_; }

  // The message of the core::InputError `read` throws, after checking that it names the file.
  std::string input_error(const std::function<void()>& read) const {
    try {
      read();
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path_);
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
      return e.message();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an InputError: " << e.what();
      return {};
    }
    ADD_FAILURE() << "no error";
    return {};
  }

  // Whether attribute `name` of the file is stored as exactly `type`.
  bool attribute_type_is(const char* name, hid_t type) const {
    Handle attribute(H5Aopen(file(), name, H5P_DEFAULT), H5Aclose);
    Handle stored(H5Aget_type(attribute.get()), H5Tclose);
    return H5Tequal(stored.get(), type) > 0;
  }
  // The shape of attribute `name` of the file: empty for a scalar.
  std::vector<hsize_t> attribute_dims(const char* name) const {
    Handle attribute(H5Aopen(file(), name, H5P_DEFAULT), H5Aclose);
    Handle space(H5Aget_space(attribute.get()), H5Sclose);
    std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.get())));
    if (!dims.empty()) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    return dims;
  }

  QuietHdf5 quiet_;
  TempDir dir_;
  std::string path_;
  Handle file_;
  Hdf5Checker reading_{dir_.file("test.h5"), core::ErrorKind::input};
  Hdf5Checker writing_{dir_.file("test.h5"), core::ErrorKind::internal};
};

// ---------------------------------------------------------------------------------------------------------
// Attributes

TEST_F(Hdf5File, ScalarAttributesRoundTripWithTheirStoredTypes) {
  write_attribute<std::string>(writing(), file(), "text", "tessera-shard ä µm");
  write_attribute<std::string>(writing(), file(), "empty", "");
  write_attribute<std::int32_t>(writing(), file(), "int32", -7);
  write_attribute<std::int64_t>(writing(), file(), "int64", std::numeric_limits<std::int64_t>::min());
  write_attribute<std::uint64_t>(writing(), file(), "uint64", std::numeric_limits<std::uint64_t>::max());
  write_attribute<double>(writing(), file(), "double", 0.2425);
  write_attribute<float>(writing(), file(), "float", 0.5f);

  EXPECT_EQ(read_attribute<std::string>(reading(), file(), "text"), "tessera-shard ä µm");
  EXPECT_EQ(read_attribute<std::string>(reading(), file(), "empty"), "");
  EXPECT_EQ(read_attribute<std::int64_t>(reading(), file(), "int32"), -7);
  EXPECT_EQ(read_attribute<std::int64_t>(reading(), file(), "int64"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(read_attribute<std::uint64_t>(reading(), file(), "uint64"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(read_attribute<double>(reading(), file(), "double"), 0.2425);
  EXPECT_EQ(read_attribute<double>(reading(), file(), "float"), 0.5);
  EXPECT_EQ(read_attribute<double>(reading(), file(), "int32"), -7.0);  // a number may be stored as an integer

  EXPECT_TRUE(attribute_type_is("int32", H5T_STD_I32LE));
  EXPECT_TRUE(attribute_type_is("int64", H5T_STD_I64LE));
  EXPECT_TRUE(attribute_type_is("uint64", H5T_STD_U64LE));
  EXPECT_TRUE(attribute_type_is("double", H5T_IEEE_F64LE));
  EXPECT_TRUE(attribute_type_is("float", H5T_IEEE_F32LE));
  EXPECT_TRUE(attribute_dims("int64").empty()) << "a scalar dataspace";
  Handle attribute(H5Aopen(file(), "text", H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attribute.get()), H5Tclose);
  EXPECT_EQ(H5Tget_class(type.get()), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(type.get()), 0) << "variable-length, as h5py writes str";
  EXPECT_EQ(H5Tget_cset(type.get()), H5T_CSET_UTF8);
  EXPECT_TRUE(attribute_dims("text").empty());
}

TEST_F(Hdf5File, ArrayAttributesRoundTrip) {
  const std::vector<std::string> names = {"normal", "tumour", ""};
  write_attribute<std::vector<std::string>>(writing(), file(), "names", names);
  write_attribute<std::vector<std::int64_t>>(writing(), file(), "ints", {1, -2, 3});
  write_attribute<std::vector<std::uint64_t>>(writing(), file(), "uints", {std::uint64_t{1} << 63});
  write_attribute<std::vector<double>>(writing(), file(), "doubles", {0.5, -0.25});
  write_attribute<std::vector<double>>(writing(), file(), "none", {});
  write_attribute<std::vector<std::string>>(writing(), file(), "no_names", {});

  EXPECT_EQ(read_attribute<std::vector<std::string>>(reading(), file(), "names"), names);
  EXPECT_EQ(read_attribute<std::vector<std::int64_t>>(reading(), file(), "ints"),
            (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(read_attribute<std::vector<std::uint64_t>>(reading(), file(), "uints"),
            std::vector<std::uint64_t>{std::uint64_t{1} << 63});
  EXPECT_EQ(read_attribute<std::vector<double>>(reading(), file(), "doubles"), (std::vector<double>{0.5, -0.25}));
  EXPECT_TRUE(read_attribute<std::vector<double>>(reading(), file(), "none").empty());
  EXPECT_TRUE(read_attribute<std::vector<std::string>>(reading(), file(), "no_names").empty());
  // A scalar is a list of one.
  write_attribute<std::string>(writing(), file(), "one", "x");
  EXPECT_EQ(read_attribute<std::vector<std::string>>(reading(), file(), "one"), std::vector<std::string>{"x"});

  EXPECT_EQ(attribute_dims("ints"), std::vector<hsize_t>{3});
  EXPECT_EQ(attribute_dims("none"), std::vector<hsize_t>{0});
  EXPECT_TRUE(attribute_type_is("ints", H5T_STD_I64LE));
  EXPECT_TRUE(attribute_type_is("uints", H5T_STD_U64LE));
}

TEST_F(Hdf5File, FixedLengthStringsAsNumpyWritesThemAreRead) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), 6);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(file(), "format", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ASSERT_GE(H5Awrite(attribute.get(), type.get(), "macenk"), 0);
  attribute.close();
  EXPECT_EQ(read_attribute<std::string>(reading(), file(), "format"), "macenk");

  const hsize_t two = 2;
  Handle list_space(H5Screate_simple(1, &two, nullptr), H5Sclose);
  Handle list(H5Acreate2(file(), "list", type.get(), list_space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char data[12] = {'a', 'b', 0, 0, 0, 0, 'c', 'd', 'e', 'f', 'g', 'h'};
  ASSERT_GE(H5Awrite(list.get(), type.get(), data), 0);
  list.close();
  EXPECT_EQ(read_attribute<std::vector<std::string>>(reading(), file(), "list"),
            (std::vector<std::string>{"ab", "cdefgh"}));
}

TEST_F(Hdf5File, AMissingAttributeIsAnInputErrorNamingTheFile) {
  EXPECT_FALSE(has_attribute(reading(), file(), "format"));
  EXPECT_EQ(input_error([&] { read_attribute<std::string>(reading(), file(), "format"); }),
            "missing attribute 'format'");
  EXPECT_EQ(input_error([&] { read_attribute<std::int64_t>(reading(), file(), "step", "/meta"); }),
            "missing attribute 'step' in /meta");
  write_attribute<std::int64_t>(writing(), file(), "step", 3);
  EXPECT_TRUE(has_attribute(reading(), file(), "step"));
}

TEST_F(Hdf5File, AnAttributeOfTheWrongTypeOrShapeIsAnInputErrorNamingTheFile) {
  write_attribute<std::string>(writing(), file(), "text", "12");
  write_attribute<std::int64_t>(writing(), file(), "int", 12);
  write_attribute<double>(writing(), file(), "double", 1.5);
  write_attribute<std::vector<std::int64_t>>(writing(), file(), "ints", {1, 2});
  write_attribute<std::vector<std::int64_t>>(writing(), file(), "no_ints", {});
  const hsize_t dims[2] = {2, 2};
  Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Handle grid(H5Acreate2(file(), "grid", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  grid.close();

  EXPECT_EQ(input_error([&] { read_attribute<std::int64_t>(reading(), file(), "text"); }),
            "attribute 'text' must be an integer");
  EXPECT_EQ(input_error([&] { read_attribute<std::int64_t>(reading(), file(), "double", "/meta"); }),
            "attribute 'double' in /meta must be an integer");
  EXPECT_EQ(input_error([&] { read_attribute<double>(reading(), file(), "text"); }),
            "attribute 'text' must be a number");
  EXPECT_EQ(input_error([&] { read_attribute<std::string>(reading(), file(), "int"); }),
            "attribute 'int' must be a string");
  EXPECT_EQ(input_error([&] { read_attribute<std::int64_t>(reading(), file(), "ints"); }),
            "attribute 'ints' must be a single value");
  EXPECT_EQ(input_error([&] { read_attribute<std::int64_t>(reading(), file(), "no_ints"); }),
            "attribute 'no_ints' must be a single value");
  EXPECT_EQ(input_error([&] { read_attribute<std::vector<std::string>>(reading(), file(), "ints", "/meta"); }),
            "attribute 'ints' in /meta must be a list of strings");
  EXPECT_EQ(input_error([&] { read_attribute<std::vector<std::int64_t>>(reading(), file(), "grid"); }),
            "attribute 'grid' must be a list of integers");
  EXPECT_EQ(input_error([&] { read_attribute<std::vector<double>>(reading(), file(), "text"); }),
            "attribute 'text' must be a list of numbers");
}

TEST_F(Hdf5File, OpenAttributeTellsTheStoredTypeAndShape) {
  write_attribute<std::uint64_t>(writing(), file(), "seed", 42);
  write_attribute<std::vector<double>>(writing(), file(), "losses", {0.5, 0.25, 0.125});
  const Attribute seed = open_attribute(reading(), file(), "seed", "/state");
  EXPECT_EQ(seed.label, "attribute 'seed' in /state");
  EXPECT_EQ(seed.type_class, H5T_INTEGER);
  EXPECT_EQ(H5Tget_sign(seed.type.get()), H5T_SGN_NONE);
  EXPECT_EQ(seed.space_class, H5S_SCALAR);
  EXPECT_TRUE(seed.dims.empty());
  EXPECT_EQ(seed.size, 1u);
  EXPECT_EQ(read_values<std::uint64_t>(reading(), seed), std::vector<std::uint64_t>{42});
  const Attribute losses = open_attribute(reading(), file(), "losses");
  EXPECT_EQ(losses.label, "attribute 'losses'");
  EXPECT_EQ(losses.type_class, H5T_FLOAT);
  EXPECT_EQ(losses.space_class, H5S_SIMPLE);
  EXPECT_EQ(losses.dims, std::vector<hsize_t>{3});
  EXPECT_EQ(losses.size, 3u);
  EXPECT_EQ(read_values<double>(reading(), losses), (std::vector<double>{0.5, 0.25, 0.125}));
  EXPECT_EQ(read_values<std::int64_t>(reading(), open_attribute(reading(), file(), "seed")),
            std::vector<std::int64_t>{42});
}

TEST_F(Hdf5File, AFailingWriteIsAnInternalErrorWithTheFile) {
  write_attribute<std::int64_t>(writing(), file(), "version", 1);
  try {
    write_attribute<std::int64_t>(writing(), file(), "version", 2);  // exists already: H5Acreate2 fails
    FAIL() << "no error";
  } catch (const core::InternalError& e) {
    EXPECT_EQ(std::string(e.message()).rfind("cannot write attribute 'version': HDF5: ", 0), 0u) << e.message();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_attribute<std::int64_t>(reading(), file(), "version"), 1);
}

// A reader with more to say about every refusal overrides error_text(); every path to an error goes through it.
TEST_F(Hdf5File, ACheckerCanRewordEveryRefusal) {
  class Noting : public Hdf5Checker {
   public:
    using Hdf5Checker::Hdf5Checker;

   protected:
    std::string error_text(const std::string& message) const override { return message + " (noted)"; }
  };
  const Noting noting(path_, core::ErrorKind::input);
  EXPECT_EQ(input_error([&] { read_attribute<std::string>(noting, file(), "absent"); }),
            "missing attribute 'absent' (noted)");
  EXPECT_EQ(input_error([&] {
              noting.check(H5Aopen(file(), "absent", H5P_DEFAULT), "cannot open");
            }).rfind("cannot open: HDF5: ", 0),
            0u);
  EXPECT_EQ(input_error([&] { noting.fail_system("cannot read", ENOSPC); }),
            "cannot read: No space left on device (noted)");
}

// ---------------------------------------------------------------------------------------------------------
// Datasets

// The layout, allocation time and fill time of a dataset, and whether it records modification times.
struct Storage {
  H5D_layout_t layout;
  H5D_alloc_time_t allocation;
  H5D_fill_time_t fill;
  bool track_times;
};
Storage storage_of(const Handle& dataset) {
  Handle dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
  Storage s{};
  s.layout = H5Pget_layout(dcpl.get());
  H5Pget_alloc_time(dcpl.get(), &s.allocation);
  H5Pget_fill_time(dcpl.get(), &s.fill);
  hbool_t track = 0;
  H5Pget_obj_track_times(dcpl.get(), &track);
  s.track_times = track != 0;
  return s;
}

TEST_F(Hdf5File, DatasetsRoundTripWithTheirStoredTypes) {
  const std::vector<std::uint8_t> bytes = {0, 1, 255, 7, 8, 9};
  const std::vector<float> floats = {0.25f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  const std::vector<std::int64_t> pairs = {1, -2, std::int64_t{1} << 40, 4};
  const std::vector<std::uint32_t> indices = {0, 4000000000u};
  const std::vector<std::string> ids = {"tumor_001", "slide-ä", ""};
  {
    Handle b = create_dataset<std::uint8_t>(writing(), file(), "bytes", {2, 3});
    Handle f = create_dataset<float>(writing(), file(), "floats", {3});
    Handle p = create_dataset<std::int64_t>(writing(), file(), "pairs", {2, 2});
    Handle i = create_dataset<std::uint32_t>(writing(), file(), "indices", {2});
    Handle s = create_dataset<std::string>(writing(), file(), "ids", {3});
    Handle scalar = create_dataset<double>(writing(), file(), "scalar", {});
    Handle empty = create_dataset<float>(writing(), file(), "empty", {0, 3});
    write_dataset(writing(), b, bytes, "cannot write dataset 'bytes'");
    write_dataset(writing(), f, floats, "cannot write dataset 'floats'");
    write_dataset(writing(), p, pairs, "cannot write dataset 'pairs'");
    write_dataset(writing(), i, indices, "cannot write dataset 'indices'");
    write_dataset(writing(), s, ids, "cannot write dataset 'ids'");
    write_dataset(writing(), scalar, std::vector<double>{2.5}, "cannot write dataset 'scalar'");
    write_dataset(writing(), empty, std::vector<float>{}, "cannot write dataset 'empty'");
  }

  const Dataset b = open_dataset(reading(), file(), "bytes");
  EXPECT_EQ(b.name, "bytes");
  EXPECT_EQ(b.type_class, H5T_INTEGER);
  EXPECT_EQ(b.dims, (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(b.size(), 6u);
  EXPECT_GT(H5Tequal(b.type.get(), H5T_STD_U8LE), 0);
  EXPECT_EQ(read_dataset<std::uint8_t>(reading(), b), bytes);
  // Read wide: converted as HDF5 converts.
  EXPECT_EQ(read_dataset<std::int64_t>(reading(), b), (std::vector<std::int64_t>{0, 1, 255, 7, 8, 9}));

  const Dataset f = open_dataset(reading(), file(), "floats");
  EXPECT_GT(H5Tequal(f.type.get(), H5T_IEEE_F32LE), 0);
  const std::vector<float> floats_back = read_dataset<float>(reading(), f);
  ASSERT_EQ(floats_back.size(), 3u);
  EXPECT_EQ(floats_back[0], 0.25f);
  EXPECT_TRUE(std::isnan(floats_back[1]));
  EXPECT_EQ(floats_back[2], -1.0f);

  const Dataset p = open_dataset(reading(), file(), "pairs");
  EXPECT_GT(H5Tequal(p.type.get(), H5T_STD_I64LE), 0);
  EXPECT_EQ(read_dataset<std::int64_t>(reading(), p), pairs);
  const Dataset i = open_dataset(reading(), file(), "indices");
  EXPECT_GT(H5Tequal(i.type.get(), H5T_STD_U32LE), 0);
  EXPECT_EQ(read_dataset<std::uint32_t>(reading(), i), indices);

  const Dataset s = open_dataset(reading(), file(), "ids");
  EXPECT_EQ(s.type_class, H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(s.type.get()), 0);
  EXPECT_EQ(H5Tget_cset(s.type.get()), H5T_CSET_UTF8);
  EXPECT_EQ(read_dataset<std::string>(reading(), s), ids);

  const Dataset scalar = open_dataset(reading(), file(), "scalar");
  EXPECT_TRUE(scalar.dims.empty());
  EXPECT_EQ(scalar.size(), 1u);
  EXPECT_EQ(read_dataset<double>(reading(), scalar), std::vector<double>{2.5});
  const Dataset empty = open_dataset(reading(), file(), "empty");
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_TRUE(read_dataset<float>(reading(), empty).empty());
}

TEST_F(Hdf5File, NewDatasetsAreContiguous) {
  Handle plain = create_dataset<float>(writing(), file(), "plain", {4});
  const Storage p = storage_of(plain);
  EXPECT_EQ(p.layout, H5D_CONTIGUOUS);
  EXPECT_EQ(p.allocation, H5D_ALLOC_TIME_LATE);
  EXPECT_TRUE(p.track_times);
  EXPECT_EQ(H5Dget_offset(plain.get()), HADDR_UNDEF) << "no storage before the first write";

  Handle early = create_dataset<std::uint8_t>(writing(), file(), "early", {2, 4, 4, 3},
                                              {.allocation = DatasetOptions::Allocation::early_unfilled});
  const Storage e = storage_of(early);
  EXPECT_EQ(e.layout, H5D_CONTIGUOUS);
  EXPECT_EQ(e.allocation, H5D_ALLOC_TIME_EARLY);
  EXPECT_EQ(e.fill, H5D_FILL_TIME_NEVER);
  EXPECT_NE(H5Dget_offset(early.get()), HADDR_UNDEF) << "the file offset exists from the start";

  Handle timeless = create_dataset<float>(writing(), file(), "timeless", {}, {.track_times = false});
  EXPECT_FALSE(storage_of(timeless).track_times);
}

TEST_F(Hdf5File, DatasetRefusalsAreInputErrorsNamingTheFile) {
  {
    Handle labels = create_dataset<std::uint8_t>(writing(), file(), "labels", {5});
    write_dataset(writing(), labels, std::vector<std::uint8_t>(5, 1), "cannot write dataset 'labels'");
  }
  EXPECT_EQ(input_error([&] { open_dataset(reading(), file(), "coords"); }), "missing dataset 'coords'");
  EXPECT_EQ(input_error([&] { open_dataset(reading(), file(), "/prob", "cannot read dataset '/prob'"); }),
            "missing dataset '/prob'");
  const Dataset labels = open_dataset(reading(), file(), "labels");
  expect_class(reading(), labels, H5T_INTEGER, "integers");
  expect_shape(reading(), labels, {5});
  EXPECT_EQ(input_error([&] { expect_class(reading(), labels, H5T_FLOAT, "floating-point numbers"); }),
            "dataset 'labels' must hold floating-point numbers");
  EXPECT_EQ(input_error([&] {
              expect_shape(reading(), labels, {5, 2});
            }),
            "dataset 'labels' has shape [5], expected [5, 2]");
}

TEST_F(Hdf5File, AFailingDatasetCreationIsAnInternalErrorWithTheFile) {
  Handle first = create_dataset<float>(writing(), file(), "x", {1});
  try {
    create_dataset<float>(writing(), file(), "x", {1});  // exists already
    FAIL() << "no error";
  } catch (const core::InternalError& e) {
    EXPECT_EQ(std::string(e.message()).rfind("cannot create dataset 'x': HDF5: ", 0), 0u) << e.message();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  try {
    create_dataset<float>(writing(), file(), "x", {1}, {}, "cannot create tensor 'x' in /params");
    FAIL() << "no error";
  } catch (const core::InternalError& e) {
    EXPECT_EQ(std::string(e.message()).rfind("cannot create tensor 'x' in /params: HDF5: ", 0), 0u) << e.message();
  }
}

TEST(Hdf5Helpers, DescribeDimsAndLabels) {
  EXPECT_EQ(describe_dims({}), "[]");
  EXPECT_EQ(describe_dims({40, 3}), "[40, 3]");
  EXPECT_EQ(attribute_label("mpp"), "attribute 'mpp'");
  EXPECT_EQ(attribute_label("mpp", "/meta"), "attribute 'mpp' in /meta");
}

}  // namespace
}  // namespace tessera::io::hdf5
