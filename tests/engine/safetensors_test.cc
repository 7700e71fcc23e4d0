#include "engine/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <random>

#include "engine/safetensors_writer.h"
#include "tests/engine/loader_test_util.h"

namespace baton::engine {
namespace {

using loader_testing::expect_error;
using loader_testing::raw_safetensors;
using loader_testing::raw_safetensors_unpadded;
using loader_testing::read_file;
using loader_testing::ScratchDir;
using loader_testing::write_file;

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng() & 0xff);
  return s;
}

TEST(SafetensorsTest, RoundTripOverDtypesAndShapes) {
  ScratchDir dir;
  // Packed back to back: 4-byte types first, then the 2-byte ones.
  const std::vector<TensorSpec> specs = {
      {"a.f32", DType::kF32, {2, 3}},      {"d.scalar", DType::kF32, {}},
      {"g.wide", DType::kF32, {2, 2}},     {"b.f16", DType::kF16, {5}},
      {"c.bf16", DType::kBF16, {4, 1, 2}}, {"e.empty", DType::kF16, {0, 3}},
      {"f.odd", DType::kBF16, {3}},
  };
  // Each tensor's bytes, with the expected size computed here from the shape.
  std::vector<std::string> data;
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t n = specs[i].dtype == DType::kF32 ? 4 : 2;
    for (int64_t d : specs[i].shape) n *= size_t(d);
    data.push_back(random_bytes(n, uint32_t(i + 1)));
  }
  const auto path = dir / "rt.safetensors";
  {
    auto w = SafetensorsWriter::create(path, specs, {{"format", "pt"}, {"note", "x y"}});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    // Stream in 7-byte chunks that cross tensor boundaries.
    std::string all;
    for (const auto& d : data) all += d;
    for (size_t off = 0; off < all.size(); off += 7) {
      ASSERT_TRUE((*w)->write(all.data() + off, std::min<size_t>(7, all.size() - off)).is_ok());
    }
    EXPECT_EQ((*w)->remaining(), 0u);
    ASSERT_TRUE((*w)->finish().is_ok());
  }
  // The header is padded to a multiple of 8.
  const std::string bytes = read_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ(header_len % 8, 0u);

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->num_tensors(), specs.size());
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.scalar",
                                                     "e.empty", "f.odd", "g.wide"}));
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->metadata().at("note"), "x y");
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo* t = (*f)->find(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->shape, specs[i].shape);
    ASSERT_EQ(t->nbytes, data[i].size());
    EXPECT_EQ(std::memcmp(t->data, data[i].data(), data[i].size()), 0) << specs[i].name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % dtype_size(t->dtype), 0u);
  }
  EXPECT_EQ((*f)->find("nope"), nullptr);
}

TEST(SafetensorsTest, WriterRefusesMisuse) {
  ScratchDir dir;
  auto dup = SafetensorsWriter::create(dir / "d.safetensors",
                                       {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}});
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  auto reserved =
      SafetensorsWriter::create(dir / "r.safetensors", {{"__metadata__", DType::kF32, {1}}});
  EXPECT_EQ(reserved.status().code(), StatusCode::kInvalidArgument);

  auto w = SafetensorsWriter::create(dir / "w.safetensors", {{"x", DType::kF32, {2}}});
  ASSERT_TRUE(w.is_ok());
  const float v[3] = {1, 2, 3};
  EXPECT_EQ((*w)->write(v, sizeof v).code(), StatusCode::kOutOfRange);  // 12 > 8 declared
  ASSERT_TRUE((*w)->write(v, 4).is_ok());
  EXPECT_EQ((*w)->finish().code(), StatusCode::kOutOfRange);  // 4 of 8 bytes
  ASSERT_TRUE((*w)->write(v, 4).is_ok());
  EXPECT_TRUE((*w)->finish().is_ok());

  // An F32 after 3 BF16 elements would start at byte 6.
  auto misaligned = SafetensorsWriter::create(dir / "m.safetensors",
                                              {{"h", DType::kBF16, {3}}, {"f", DType::kF32, {1}}});
  expect_error(misaligned.status(), StatusCode::kInvalidArgument, {"'f'", "aligned"});

  auto nodir = SafetensorsWriter::create(dir / "missing" / "x.safetensors", {});
  EXPECT_EQ(nodir.status().code(), StatusCode::kIoError);
}

// One malformed file: its bytes, the expected code, and what the message names.
struct Malformed {
  std::string label;
  std::string bytes;
  StatusCode code;
  std::vector<std::string> needles;
};

std::vector<Malformed> malformed_cases() {
  const std::string d16(16, '\x01');  // 16 data bytes
  std::vector<Malformed> c;
  c.push_back({"empty", "", StatusCode::kDataLoss, {}});
  c.push_back({"five_bytes", std::string("\x05\0\0\0\0", 5), StatusCode::kDataLoss, {}});
  c.push_back({"header_past_end", raw_safetensors("{}", "", 64), StatusCode::kDataLoss, {"64"}});
  c.push_back({"header_absurd",
               raw_safetensors("{}", "", int64_t(1) << 40),
               StatusCode::kDataLoss,
               {"header length"}});
  c.push_back({"header_len_max", raw_safetensors("{}", "", INT64_MAX), StatusCode::kDataLoss, {}});
  c.push_back({"invalid_json", raw_safetensors("{\"a\": ", ""), StatusCode::kDataLoss, {"JSON"}});
  c.push_back({"not_object", raw_safetensors("[1, 2]  ", ""), StatusCode::kDataLoss, {"object"}});
  c.push_back(
      {"entry_not_object", raw_safetensors(R"({"w": 3})", ""), StatusCode::kDataLoss, {"'w'"}});
  c.push_back({"no_dtype",
               raw_safetensors(R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", d16),
               StatusCode::kDataLoss,
               {"'w'", "dtype"}});
  c.push_back({"no_shape",
               raw_safetensors(R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", d16),
               StatusCode::kDataLoss,
               {"'w'", "shape"}});
  c.push_back({"no_offsets",
               raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4]}})", d16),
               StatusCode::kDataLoss,
               {"'w'", "data_offsets"}});
  c.push_back(
      {"dtype_not_string",
       raw_safetensors(R"({"w": {"dtype": 7, "shape": [4], "data_offsets": [0, 16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "dtype"}});
  c.push_back(
      {"shape_not_list",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "shape"}});
  c.push_back(
      {"shape_float_dim",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "shape"}});
  c.push_back(
      {"offsets_one",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "data_offsets"}});
  c.push_back({"offsets_strings",
               raw_safetensors(
                   R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": ["0", "16"]}})", d16),
               StatusCode::kDataLoss,
               {"'w'", "data_offsets"}});
  c.push_back(
      {"offsets_negative",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "data_offsets"}});
  c.push_back(
      {"dtype_i8",
       raw_safetensors(R"({"w": {"dtype": "I8", "shape": [16], "data_offsets": [0, 16]}})", d16),
       StatusCode::kUnimplemented,
       {"'w'", "I8"}});
  c.push_back(
      {"dtype_f64",
       raw_safetensors(R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", d16),
       StatusCode::kUnimplemented,
       {"'w'", "F64"}});
  c.push_back(
      {"negative_dim",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "negative"}});
  c.push_back({"numel_overflow",
               raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 2],
                                   "data_offsets": [0, 16]}})",
                               d16),
               StatusCode::kDataLoss,
               {"'w'", "overflow"}});
  c.push_back({"bytes_overflow",
               raw_safetensors(R"({"w": {"dtype": "F32", "shape": [4611686018427387904],
                                   "data_offsets": [0, 16]}})",
                               d16),
               StatusCode::kDataLoss,
               {"'w'", "overflow"}});
  c.push_back({"dim_too_large",
               raw_safetensors(R"({"w": {"dtype": "F32", "shape": [18446744073709551615, 0],
                                   "data_offsets": [0, 0]}})",
                               d16),
               StatusCode::kDataLoss,
               {"'w'", "overflow"}});
  c.push_back(
      {"begin_after_end",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [16, 8]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "begin"}});
  c.push_back(
      {"end_past_data",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "past the end"}});
  c.push_back(
      {"size_mismatch",
       raw_safetensors(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", d16),
       StatusCode::kDataLoss,
       {"'w'", "needs 12"}});
  c.push_back({"overlap",
               raw_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}})",
                               d16),
               StatusCode::kDataLoss,
               {"'a'", "'b'", "overlap"}});
  c.push_back({"overlap_contained",
               raw_safetensors(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                   "b": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]}})",
                               d16),
               StatusCode::kDataLoss,
               {"overlap"}});
  c.push_back({"misaligned",
               raw_safetensors(R"({"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})",
                               d16),
               StatusCode::kDataLoss,
               {"'b'", "aligned"}});
  c.push_back({"metadata_not_object",
               raw_safetensors(R"({"__metadata__": [1]})", ""),
               StatusCode::kDataLoss,
               {"__metadata__"}});
  c.push_back({"metadata_not_string",
               raw_safetensors(R"({"__metadata__": {"k": 1}})", ""),
               StatusCode::kDataLoss,
               {"__metadata__", "'k'"}});
  return c;
}

TEST(SafetensorsTest, MalformedFilesAreRefusedWithTheRightCode) {
  ScratchDir dir;
  for (const Malformed& m : malformed_cases()) {
    SCOPED_TRACE(m.label);
    const std::string name = "case_" + m.label + ".safetensors";
    write_file(dir / name, m.bytes);
    auto f = SafetensorsFile::open(dir / name);
    std::vector<std::string> needles = m.needles;
    needles.push_back(name);
    expect_error(f.status(), m.code, needles);
  }
}

TEST(SafetensorsTest, AcceptsUnpaddedHeaderWhenElementsStayAligned) {
  // A header not padded to 8: data at 2 mod 4 is fine for F16, not for F32.
  ScratchDir dir;
  std::string header = R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})";
  while ((8 + header.size()) % 4 != 2) header += " ";  // data starts 2 mod 4
  write_file(dir / "f16.safetensors",
             raw_safetensors_unpadded(header, std::string("\x00\x3c\x00\xc0", 4)));
  auto f = SafetensorsFile::open(dir / "f16.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const TensorInfo* t = (*f)->find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(load_as_float(t->data, t->dtype, 0), 1.0f);
  EXPECT_EQ(load_as_float(t->data, t->dtype, 1), -2.0f);

  std::string h32 = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  while ((8 + h32.size()) % 4 != 2) h32 += " ";
  write_file(dir / "f32.safetensors", raw_safetensors_unpadded(h32, std::string(4, '\0')));
  expect_error(SafetensorsFile::open(dir / "f32.safetensors").status(), StatusCode::kDataLoss,
               {"'w'", "aligned"});
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  ScratchDir dir;
  expect_error(SafetensorsFile::open(dir / "absent.safetensors").status(), StatusCode::kNotFound,
               {"absent.safetensors"});
}

// A FIFO where a weights file belongs would block the open for a writer.
TEST(SafetensorsTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  ScratchDir dir;
  const auto fifo = dir / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(SafetensorsFile::open(fifo).status(), StatusCode::kIoError,
               {"model.safetensors", "not a regular file"});
}

std::string small_valid_file(const ScratchDir& dir) {
  const auto path = dir / "valid.safetensors";
  auto w = SafetensorsWriter::create(
      path, {{"a", DType::kF32, {3}}, {"b", DType::kBF16, {2, 2}}, {"c", DType::kF16, {5}}},
      {{"format", "pt"}});
  EXPECT_TRUE(w.is_ok());
  const std::string data = random_bytes(12 + 8 + 10, 9);
  EXPECT_TRUE((*w)->write(data.data(), data.size()).is_ok());
  EXPECT_TRUE((*w)->finish().is_ok());
  return read_file(path);
}

TEST(SafetensorsTest, EveryTruncationIsRejected) {
  ScratchDir dir;
  const std::string bytes = small_valid_file(dir);
  ASSERT_TRUE(SafetensorsFile::open(dir / "valid.safetensors").is_ok());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    write_file(dir / "cut.safetensors", bytes.substr(0, cut));
    auto f = SafetensorsFile::open(dir / "cut.safetensors");
    EXPECT_FALSE(f.is_ok()) << "cut at " << cut << " of " << bytes.size();
    if (!f.is_ok()) {
      EXPECT_NE(f.status().message().find("cut.safetensors"), std::string::npos);
    }
  }
}

// Corrupting any single byte either still parses into tensors inside the file
// or is refused; it never crashes (ASan checks the reads).
TEST(SafetensorsTest, CorruptedBytesNeverReadOutOfBounds) {
  ScratchDir dir;
  const std::string bytes = small_valid_file(dir);
  const uint8_t values[] = {0x00, 0x01, 0x22, 0x30, 0x39, 0x5b, 0x7b, 0x7d, 0x80, 0xff};
  int refused = 0;
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    for (uint8_t v : values) {
      std::string b = bytes;
      b[pos] = char(v);
      write_file(dir / "bad.safetensors", b);
      auto f = SafetensorsFile::open(dir / "bad.safetensors");
      if (!f.is_ok()) {
        ++refused;
        continue;
      }
      for (const std::string& name : (*f)->names()) {
        const TensorInfo* t = (*f)->find(name);
        ASSERT_NE(t, nullptr);
        // Whatever parses must lie inside the mapping.
        const auto* base = static_cast<const char*>((*f)->mapping());
        const auto* data = static_cast<const char*>(t->data);
        ASSERT_GE(data, base);
        ASSERT_LE(uint64_t(data - base) + t->nbytes, (*f)->file_size());
      }
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace baton::engine
