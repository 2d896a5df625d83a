// SafetensorsFile::open on malformed files (each a named Status, never a crash), the good path, and a header fuzz.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"

namespace klinear {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes 8-byte length + `header` + `data` and opens it.
  Status open_raw(const std::string& header, const std::string& data) {
    const std::string path = dir_.file("t.safetensors");
    write_bytes(path, le64(header.size()) + header + data);
    auto f = SafetensorsFile::open(path);
    return f.ok() ? Status() : f.status();
  }
  // The file must fail with a message that contains `needle` (and the file path).
  void expect_error(const std::string& header, const std::string& data, const std::string& needle,
                    StatusCode code = StatusCode::kCorruption) {
    Status s = open_raw(header, data);
    ASSERT_FALSE(s.ok()) << "accepted header " << header;
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message() << "\nwanted: " << needle;
    EXPECT_NE(s.message().find("t.safetensors"), std::string::npos) << s.message();
  }
  ScratchDir dir_;
};

TEST_F(SafetensorsTest, MinimalValidFileOpens) {
  // Control for the error cases below: the same crafting produces a file the reader accepts.
  ASSERT_TRUE(open_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\1')).ok());
  ASSERT_TRUE(open_raw("{}", "").ok());
}

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  const std::string path = dir_.file("t.safetensors");
  write_bytes(path, std::string("\x02\x00\x00", 3));
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_NE(f.status().message().find("too short"), std::string::npos) << f.status().message();
  write_bytes(path, "");
  EXPECT_FALSE(SafetensorsFile::open(path).ok());
}

TEST_F(SafetensorsTest, HeaderLongerThanFile) {
  const std::string path = dir_.file("t.safetensors");
  write_bytes(path, le64(100) + "{}");
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("header length 100 exceeds"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, AbsurdHeaderLength) {
  const std::string path = dir_.file("t.safetensors");
  write_bytes(path, le64(1ull << 63) + "{}");
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("header length 9223372036854775808"), std::string::npos) << f.status().message();
  write_bytes(path, le64(~0ull) + "{}");
  EXPECT_FALSE(SafetensorsFile::open(path).ok());
}

TEST_F(SafetensorsTest, HeaderOverTheSizeLimitEvenIfTheFileIsLongEnough) {
  // A sparse file: 8 + 101 MiB + some bytes, the header claims 101 MiB (limit is 100 MiB).
  const std::string path = dir_.file("t.safetensors");
  const uint64_t claimed = 101ull << 20;
  write_bytes(path, le64(claimed) + "{");
  fs::resize_file(path, 8 + claimed + 64);
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("exceeds the limit"), std::string::npos) << f.status().message();
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  expect_error(R"({"a": {"dtype": "F32", )", "", "invalid JSON", StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  expect_error(R"([1, 2, 3])", "", "header must be a JSON object");
  expect_error(R"("text")", "", "header must be a JSON object");
}

TEST_F(SafetensorsTest, EntryNotAnObject) {
  expect_error(R"({"a": 5})", "", "tensor 'a': entry must be an object");
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_error(R"({"w":{"dtype":"F8_E5M2x","shape":[1],"data_offsets":[0,1]}})", "x", "unknown dtype 'F8_E5M2x'");
  expect_error(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "x", "missing string 'dtype'");
}

TEST_F(SafetensorsTest, BadShapeEntries) {
  expect_error(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x", "non-natural entry");
  expect_error(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "x", "non-natural entry");
  expect_error(R"({"w":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", "x", "non-natural entry");
  expect_error(R"({"w":{"dtype":"U8","shape":7,"data_offsets":[0,1]}})", "x", "missing array 'shape'");
  // Huge dims that overflow the element count.
  expect_error(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,1]}})", "x",
               "overflows");
}

TEST_F(SafetensorsTest, ShapeBytesDoNotMatchOffsets) {
  expect_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, '\0'),
               "needs 24 bytes, data_offsets give 20");
}

TEST_F(SafetensorsTest, BadDataOffsets) {
  expect_error(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", "0123", "end before begin");
  expect_error(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "01", "two non-negative integers");
  expect_error(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", "01", "two non-negative integers");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
               "012345", "overlap");
  expect_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
               "0123", "overlap");
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  expect_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                   "b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
               "01234", "tensor 'b' data_offsets [3, 5] leave a gap");
  // A gap at the very start.
  expect_error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", "012", "leave a gap");
}

TEST_F(SafetensorsTest, OffsetsPastTheEndOfData) {
  expect_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(12, '\0'),
               "tensors cover 16 bytes but the data region has 12 (truncated file?)");
}

TEST_F(SafetensorsTest, TrailingBytesAfterLastTensor) {
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(11, '\0'),
               "tensors cover 8 bytes but the data region has 11 (trailing bytes)");
}

TEST_F(SafetensorsTest, MetadataMustBeAnObjectOfStrings) {
  expect_error(R"({"__metadata__":[1,2]})", "", "__metadata__ must be an object");
  expect_error(R"({"__metadata__":{"format":3}})", "", "__metadata__ value 'format' is not a string");
}

TEST_F(SafetensorsTest, NonexistentPathIsIOError) {
  auto f = SafetensorsFile::open(dir_.file("does-not-exist.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kIOError);
  EXPECT_NE(f.status().message().find("does-not-exist.safetensors"), std::string::npos) << f.status().message();
  // A directory is not a regular file.
  auto d = SafetensorsFile::open(dir_.file(""));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kIOError);
}

// Several dtypes; values chosen so every byte is distinct enough to catch a misplaced range.
std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("layer.f32", Tensor::from_f32({2, 3}, {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f}));
  Tensor bf = Tensor::empty(DType::kBF16, {5});
  for (int i = 0; i < 5; ++i) bf.data_as<uint16_t>()[i] = f32_to_bf16(0.5f * i - 1.0f);
  t.emplace_back("layer.bf16", bf);
  Tensor u8 = Tensor::empty(DType::kU8, {3, 1});
  for (int i = 0; i < 3; ++i) u8.data_as<uint8_t>()[i] = static_cast<uint8_t>(200 + i);
  t.emplace_back("a.u8", u8);
  Tensor i32 = Tensor::empty(DType::kI32, {2, 2});
  const int32_t iv[4] = {-1, 7, 1 << 30, -123456};
  std::memcpy(i32.data(), iv, sizeof(iv));
  t.emplace_back("z.i32", i32);
  t.emplace_back("empty.f32", Tensor::empty(DType::kF32, {0, 4}));
  return t;
}

TEST_F(SafetensorsTest, RoundTripSeveralDtypes) {
  const std::string path = dir_.file("good.safetensors");
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"author", "klinear tests"}};
  ASSERT_TRUE(write_safetensors(path, tensors, meta).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->entries().size(), tensors.size());
  EXPECT_EQ(f->find("not-there"), nullptr);
  size_t total = 0;
  for (const auto& [name, want] : tensors) {
    const SafetensorsEntry* e = f->find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->name, name);
    EXPECT_EQ(e->dtype, want.dtype()) << name;
    EXPECT_EQ(e->shape, want.shape()) << name;
    EXPECT_EQ(e->end - e->begin, want.nbytes()) << name;
    total += e->end - e->begin;
    Tensor got = f->tensor(*e);
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_EQ(got.device(), Device::kCpu);
    if (want.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << name;
    }
  }
  EXPECT_EQ(total, 6 * 4 + 5 * 2 + 3 + 4 * 4);
  // The header is padded to a multiple of 8 bytes.
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + total);
}

TEST_F(SafetensorsTest, ViewsOutliveTheFileObject) {
  const std::string path = dir_.file("good.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample_tensors()).ok());
  Tensor view;
  {
    auto f = SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->metadata().at("format"), "pt");  // the default metadata
    view = f->tensor(*f->find("layer.f32"));
  }
  ASSERT_TRUE(view.defined());
  EXPECT_EQ(view.f32()[0], 1.5f);
  EXPECT_EQ(view.f32()[5], -7.0f);
}

TEST_F(SafetensorsTest, TruncatedInTheDataRegion) {
  const std::string path = dir_.file("t.safetensors");
  ASSERT_TRUE(write_safetensors(path, sample_tensors()).ok());
  ASSERT_TRUE(SafetensorsFile::open(path).ok());
  const uintmax_t size = fs::file_size(path);
  fs::resize_file(path, size - 5);
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_NE(f.status().message().find("truncated file?"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
}

// Random mutations and truncations of a valid file's header region: every result must be an
// error Status with a message, or a file whose tensors tile its data region (then read fully).
TEST(SafetensorsFuzzTest, MutatedHeadersNeverCrash) {
  ScratchDir dir;
  const std::string good = dir.file("good.safetensors"), path = dir.file("fuzz.safetensors");
  ASSERT_TRUE(write_safetensors(good, sample_tensors()).ok());
  const std::string base = read_bytes(good);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(base[i]);
  const size_t header_end = 8 + header_len;
  ASSERT_LT(header_end, base.size());

  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  static const char kInteresting[] = "{}[]\",:-0123456789eE.\\ \x7f\xff\x00";
  const std::string interesting(kInteresting, sizeof(kInteresting) - 1);
  int errors = 0, valid = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string bytes = base;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      const size_t limit = std::min(header_end, bytes.size());  // earlier mutations may have shortened it
      if (limit < 8) break;
      const size_t pos = rng() % limit;
      switch (rng() % 6) {
        case 0: bytes[pos] = static_cast<char>(rng() & 0xff); break;
        case 1: bytes[pos] = interesting[rng() % interesting.size()]; break;
        case 2: bytes[rng() % 8] = static_cast<char>(rng() & 0xff); break;  // the length field
        case 3: bytes.erase(pos, 1 + rng() % 4); break;
        case 4: bytes.insert(pos, 1, interesting[rng() % interesting.size()]); break;
        case 5: bytes.resize(rng() % (bytes.size() + 1)); break;
      }
    }
    write_bytes(path, bytes);
    auto f = SafetensorsFile::open(path);
    if (!f.ok()) {
      ++errors;
      EXPECT_FALSE(f.status().message().empty()) << "iteration " << iter << " seed " << seed;
      continue;
    }
    ++valid;
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(bytes[i]);
    size_t covered = 0;
    uint64_t checksum = 0;
    for (const SafetensorsEntry& e : f->entries()) {
      ASSERT_LE(e.begin, e.end);
      Tensor t = f->tensor(e);
      ASSERT_EQ(t.nbytes(), e.end - e.begin) << e.name << " iteration " << iter << " seed " << seed;
      for (size_t i = 0; i < t.nbytes(); ++i) checksum += static_cast<const uint8_t*>(t.data())[i];
      covered += e.end - e.begin;
    }
    EXPECT_EQ(8 + len + covered, bytes.size()) << "iteration " << iter << " seed " << seed << " checksum " << checksum;
  }
  std::printf("[ fuzz ] %d rejected, %d accepted\n", errors, valid);
  EXPECT_GT(errors, 100);  // the mutations do break files (the test is not vacuous)
}

}  // namespace
}  // namespace klinear
