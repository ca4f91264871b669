#include "engine/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/test_util.h"

namespace attn {
namespace {

// 8-byte little-endian length prefix.
std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string MakeFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/safetensors_test_XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

using testing::WriteFile;

// Asserts the status code and that the message contains `substring`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code,
                 const std::string& substring) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << substring;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), substring))
      << "message: " << result.status().message() << "\nexpected substring: " << substring;
}

void ExpectInvalid(const std::string& bytes, const std::string& substring) {
  ExpectError(SafetensorsFile::FromBytes(bytes, "model.safetensors"),
              absl::StatusCode::kInvalidArgument, substring);
}

Tensor MakeTensor(std::vector<int64_t> shape, std::vector<float> values) {
  return Tensor(std::move(shape), FloatBuffer(values.begin(), values.end()));
}

TEST(DTypeTest, NamesSizesAndParsing) {
  const std::vector<std::pair<std::string, int>> expected = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [name, size] : expected) {
    DType dtype;
    ASSERT_TRUE(ParseDType(name, &dtype)) << name;
    EXPECT_EQ(DTypeName(dtype), name);
    EXPECT_EQ(DTypeSize(dtype), size) << name;
  }
  DType dtype;
  EXPECT_FALSE(ParseDType("f32", &dtype));
  EXPECT_FALSE(ParseDType("F8_E4M3", &dtype));
  EXPECT_FALSE(ParseDType("", &dtype));
}

TEST(SafetensorsWriteTest, SerializeRoundTripKeepsGivenOrderAndMetadata) {
  const Tensor b = MakeTensor({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor a = MakeTensor({3}, {-1.5f, 0.25f, 1e30f});
  const Tensor scalar = MakeTensor({}, {42.0f});
  const Tensor empty = MakeTensor({0, 4}, {});
  const std::string bytes = SerializeSafetensors(
      {{"b", &b}, {"a", &a}, {"scalar", &scalar}, {"empty", &empty}}, {{"format", "pt"}});
  ASSERT_GE(bytes.size(), 8u);

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "header must be padded to a multiple of 8";
  EXPECT_EQ(bytes.size(), 8 + header_len + (6 + 3 + 1) * sizeof(float));

  auto file = SafetensorsFile::FromBytes(bytes, "roundtrip");
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  ASSERT_EQ(f.tensors().size(), 4u);
  // tensors() is sorted by name.
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.tensors()[2].name, "empty");
  EXPECT_EQ(f.tensors()[3].name, "scalar");
  EXPECT_EQ(f.metadata().at("format"), "pt");

  // Data offsets follow the order the tensors were given in.
  const TensorInfo* ib = f.Find("b");
  const TensorInfo* ia = f.Find("a");
  const TensorInfo* is = f.Find("scalar");
  ASSERT_NE(ib, nullptr);
  ASSERT_NE(ia, nullptr);
  ASSERT_NE(is, nullptr);
  EXPECT_EQ(ib->begin, 0u);
  EXPECT_EQ(ib->end, 24u);
  EXPECT_EQ(ia->begin, 24u);
  EXPECT_EQ(ia->end, 36u);
  EXPECT_EQ(is->begin, 36u);
  EXPECT_EQ(ia->dtype, DType::kF32);
  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_EQ(f.RawBytes(*ia).size(), 12u);

  auto tb = f.ReadFloat32("b");
  ASSERT_TRUE(tb.ok()) << tb.status();
  EXPECT_EQ(tb->shape(), b.shape());
  EXPECT_EQ(tb->values(), b.values());
  auto ta = f.ReadFloat32("a");
  ASSERT_TRUE(ta.ok()) << ta.status();
  EXPECT_EQ(ta->values(), a.values());
  auto ts = f.ReadFloat32("scalar");
  ASSERT_TRUE(ts.ok()) << ts.status();
  EXPECT_EQ(ts->rank(), 0);
  EXPECT_EQ(ts->values()[0], 42.0f);
  auto te = f.ReadFloat32("empty");
  ASSERT_TRUE(te.ok()) << te.status();
  EXPECT_EQ(te->shape(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(te->numel(), 0);
}

TEST(SafetensorsWriteTest, EmptyFileIsValid) {
  const std::string bytes = SerializeSafetensors({});
  EXPECT_EQ(bytes.size(), 16u);  // length + "{}" padded to 8
  auto file = SafetensorsFile::FromBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(SafetensorsWriteTest, WriteAndOpenFile) {
  const std::string path = MakeTempDir() + "/model.safetensors";
  const Tensor w = MakeTensor({2, 2}, {0.5f, -0.5f, 3.0f, 7.0f});
  const Tensor bias = MakeTensor({2}, {1.0f, 2.0f});
  ASSERT_TRUE(WriteSafetensors(path, {{"w", &w}, {"bias", &bias}}, {{"step", "7"}}).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->source_name(), path);
  EXPECT_EQ((*file)->metadata().at("step"), "7");
  auto rw = (*file)->ReadFloat32("w");
  ASSERT_TRUE(rw.ok()) << rw.status();
  EXPECT_EQ(rw->shape(), w.shape());
  EXPECT_EQ(rw->values(), w.values());

  // File bytes equal the in-memory serialisation.
  std::ifstream in(path, std::ios::binary);
  const std::string on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, SerializeSafetensors({{"w", &w}, {"bias", &bias}}, {{"step", "7"}}));
}

TEST(SafetensorsWriteTest, WriteReportsIoErrors) {
  const Tensor t = MakeTensor({1}, {1.0f});
  const std::string path = MakeTempDir() + "/no/such/dir/model.safetensors";
  const absl::Status status = WriteSafetensors(path, {{"t", &t}});
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), std::strerror(ENOENT))) << status;

  // /dev/full accepts open() but every write fails with ENOSPC.
  if (access("/dev/full", W_OK) == 0) {
    const Tensor big({1 << 16});
    const absl::Status full = WriteSafetensors("/dev/full", {{"big", &big}});
    ASSERT_FALSE(full.ok());
    EXPECT_TRUE(absl::StrContains(full.message(), std::strerror(ENOSPC))) << full;
  }
}

TEST(SafetensorsWriteTest, RejectsDuplicateAndReservedNames) {
  const Tensor t = MakeTensor({1}, {1.0f});
  const std::string path = MakeTempDir() + "/dup.safetensors";
  const absl::Status dup = WriteSafetensors(path, {{"t", &t}, {"t", &t}});
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(dup.message(), "tensor 't' given twice")) << dup;
  const absl::Status reserved = WriteSafetensors(path, {{"__metadata__", &t}});
  EXPECT_EQ(reserved.code(), absl::StatusCode::kInvalidArgument);
  // No error channel in SerializeSafetensors: an empty string, which no reader accepts.
  EXPECT_EQ(SerializeSafetensors({{"t", &t}, {"t", &t}}), "");
  const Tensor unset;  // shape [] but no values
  EXPECT_EQ(SerializeSafetensors({{"unset", &unset}}), "");
}

TEST(SafetensorsReadTest, ConvertsF16IncludingSubnormalsInfAndNan) {
  const std::vector<uint16_t> halves = {
      0x3C00,  // 1
      0xC000,  // -2
      0x3555,  // 1 + 341/1024 times 2^-2 = 0.333251953125
      0x7BFF,  // 65504, largest finite
      0x0400,  // 2^-14, smallest normal
      0x0001,  // 2^-24, smallest subnormal
      0x03FF,  // 1023 * 2^-24, largest subnormal
      0x8000,  // -0
      0x7C00,  // +inf
      0xFC00,  // -inf
      0x7E00,  // nan
  };
  const std::string header = R"({"h":{"dtype":"F16","shape":[11],"data_offsets":[0,22]}})";
  auto file = SafetensorsFile::FromBytes(MakeFile(header, BytesOf(halves)));
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->ReadFloat32("h");
  ASSERT_TRUE(t.ok()) << t.status();
  const FloatBuffer& v = t->values();
  ASSERT_EQ(v.size(), 11u);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 0.333251953125f);
  EXPECT_EQ(v[3], 65504.0f);
  EXPECT_EQ(v[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(v[5], std::ldexp(1.0f, -24));
  EXPECT_EQ(v[6], 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(v[7], 0.0f);
  EXPECT_TRUE(std::signbit(v[7]));
  EXPECT_EQ(v[8], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[9], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[10]));
}

TEST(SafetensorsReadTest, ConvertsBF16) {
  const std::vector<uint16_t> values = {
      0x3F80,  // 1
      0xC0A0,  // -5
      0x3EAA,  // 1.328125 * 2^-2 = 0.33203125
      0x0001,  // 2^-133, an fp32 subnormal
      0x7F80,  // +inf
      0x7FC0,  // nan
  };
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";
  auto file = SafetensorsFile::FromBytes(MakeFile(header, BytesOf(values)));
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->ReadFloat32("b");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
  const FloatBuffer& v = t->values();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -5.0f);
  EXPECT_EQ(v[2], 0.33203125f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(v[4], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[5]));
}

TEST(SafetensorsReadTest, ConvertsF64FromUnalignedData) {
  // One F16 element first, so the F64 tensor starts 2 bytes into the data section, and an
  // unpadded odd-length header, so the data section itself starts at an odd file offset.
  const std::vector<double> doubles = {1.5, -0.1, 1e300, 3.141592653589793};
  const std::string header = R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}, )"
                             R"("d":{"dtype":"F64","shape":[4],"data_offsets":[2,34]}})";
  ASSERT_EQ(header.size() % 2, 1u);
  const std::string data = std::string("\x00\x3c", 2) + BytesOf(doubles);
  auto file = SafetensorsFile::FromBytes(MakeFile(header, data));
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->ReadFloat32("d");
  ASSERT_TRUE(t.ok()) << t.status();
  const FloatBuffer& v = t->values();
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], -0.1f);
  EXPECT_EQ(v[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[3], 3.14159274f);
  auto h = (*file)->ReadFloat32("h");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->values()[0], 1.0f);
}

TEST(SafetensorsReadTest, NonFloatDtypeIsRejectedByReadFloat32) {
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  const std::string header =
      R"({"position_ids":{"dtype":"I64","shape":[1,4],"data_offsets":[0,32]}})";
  auto file = SafetensorsFile::FromBytes(MakeFile(header, BytesOf(ids)), "model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectError((*file)->ReadFloat32("position_ids"), absl::StatusCode::kInvalidArgument,
              "model.safetensors: tensor 'position_ids': dtype I64 cannot be read as float32");
  // The raw bytes are still available.
  const TensorInfo* info = (*file)->Find("position_ids");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ((*file)->RawBytes(*info), BytesOf(ids));
  ExpectError((*file)->ReadFloat32("nope"), absl::StatusCode::kNotFound, "no tensor named 'nope'");
}

TEST(SafetensorsRejectTest, ShorterThanEightBytes) {
  ExpectInvalid("abc", "model.safetensors: file is 3 bytes, shorter than the 8-byte header");
  ExpectInvalid("", "file is 0 bytes");
}

TEST(SafetensorsRejectTest, HeaderLengthPastEndOfFile) {
  ExpectInvalid(Le64(100) + "{}", "header length 100 runs past the end of the file");
}

TEST(SafetensorsRejectTest, HeaderLengthOverBound) {
  ExpectInvalid(Le64(SafetensorsFile::kMaxHeaderBytes + 1) + "{}",
                "exceeds the limit of 104857600 bytes");
  ExpectInvalid(Le64(~0ull) + "{}", "exceeds the limit");
}

TEST(SafetensorsRejectTest, InvalidJson) {
  ExpectInvalid(MakeFile("{\"x\": {", ""), "header is not valid JSON");
  ExpectInvalid(MakeFile("[1, 2]", ""), "header must be a JSON object, found array");
  ExpectInvalid(MakeFile(R"({"x": 3})", ""), "tensor 'x': entry must be an object");
}

TEST(SafetensorsRejectTest, UnknownDtype) {
  ExpectInvalid(MakeFile(R"({"x":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", "\0"),
                "model.safetensors: tensor 'x': unknown dtype 'F8'");
  ExpectInvalid(MakeFile(R"({"x":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", "0000"),
                "tensor 'x': missing or non-string \"dtype\"");
}

TEST(SafetensorsRejectTest, ShapeTimesDtypeDoesNotMatchRange) {
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(24, 0)),
      "model.safetensors: tensor 'x': shape [2, 3] x F32 needs 24 bytes but data_offsets span 20");
}

TEST(SafetensorsRejectTest, RangePastEndOfData) {
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", std::string(20, 0)),
      "tensor 'x': data_offsets [0, 24] run past the end of the data section (20 bytes)");
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, 0)),
      "tensor 'x': data_offsets [8, 4] have begin > end");
  ExpectInvalid(MakeFile(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "0000"),
                "tensor 'x': \"data_offsets\" must be [begin, end]");
}

TEST(SafetensorsRejectTest, OverlappingRanges) {
  ExpectInvalid(MakeFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                         R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                         std::string(24, 0)),
                "tensor 'b': data_offsets [8, 24] overlap tensor 'a' at [0, 16]");
  // Containment is caught even when a smaller tensor sits between.
  ExpectInvalid(MakeFile(R"({"big":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
                         R"("s1":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(32, 0)),
                "overlap tensor 'big'");
  // Identical ranges overlap too.
  ExpectInvalid(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                         std::string(4, 0)),
                "overlap");
}

TEST(SafetensorsRejectTest, BadShapes) {
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})", std::string(16, 0)),
      "tensor 'x': shape[0] is -1; dimensions must be non-negative integers");
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, 0)),
      "shape[0] is 2.5");
  ExpectInvalid(
      MakeFile(R"({"x":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})", std::string(16, 0)),
      "missing or non-array \"shape\"");
  // 2^32 * 2^32 * 16 wraps to 0 in 64 bits; it must not match the empty range.
  ExpectInvalid(MakeFile(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                         R"("data_offsets":[0,0]}})",
                         ""),
                "overflows");
}

TEST(SafetensorsRejectTest, DuplicateNamesAndBadMetadata) {
  ExpectInvalid(MakeFile(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(8, 0)),
                "header lists 'x' more than once");
  ExpectInvalid(MakeFile(R"({"__metadata__":{"k":1}})", ""),
                "__metadata__ 'k' must be a string, found number");
  ExpectInvalid(MakeFile(R"({"__metadata__":[]})", ""), "__metadata__ must be an object");
}

TEST(SafetensorsRejectTest, OpenMissingFileAndDirectory) {
  const std::string dir = MakeTempDir();
  ExpectError(SafetensorsFile::Open(dir + "/absent.safetensors"), absl::StatusCode::kNotFound,
              dir + "/absent.safetensors");
  ExpectError(SafetensorsFile::Open(dir), absl::StatusCode::kInvalidArgument, "not a regular file");
  // Zero-length file: cannot be mapped, must still be a clean validation error.
  WriteFile(dir + "/empty.safetensors", "");
  ExpectError(SafetensorsFile::Open(dir + "/empty.safetensors"), absl::StatusCode::kInvalidArgument,
              "empty.safetensors: file is 0 bytes");
  WriteFile(dir + "/trunc.safetensors", Le64(64) + "{}");
  ExpectError(SafetensorsFile::Open(dir + "/trunc.safetensors"), absl::StatusCode::kInvalidArgument,
              "trunc.safetensors: header length 64 runs past");
}

// Every prefix and many single-byte corruptions of a valid file must give a clean result (an
// error or a valid file), never a crash or an out-of-bounds read (checked under ASan).
TEST(SafetensorsRejectTest, TruncationsAndCorruptionsNeverCrash) {
  const Tensor a = MakeTensor({2, 2}, {1, 2, 3, 4});
  const Tensor b = MakeTensor({3}, {5, 6, 7});
  const std::string good = SerializeSafetensors({{"a", &a}, {"b", &b}}, {{"k", "v"}});
  for (size_t n = 0; n < good.size(); ++n) {
    auto file = SafetensorsFile::FromBytes(good.substr(0, n));
    EXPECT_FALSE(file.ok()) << "prefix of " << n << " bytes accepted";
  }
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    bad[rng() % bad.size()] = static_cast<char>(rng() & 0xff);
    auto file = SafetensorsFile::FromBytes(bad);
    if (!file.ok()) continue;
    for (const TensorInfo& info : (*file)->tensors()) {
      auto t = (*file)->ReadFloat32(info.name);
      if (t.ok()) {
        EXPECT_EQ(static_cast<uint64_t>(t->numel()) * DTypeSize(info.dtype), info.end - info.begin);
      }
    }
  }
}

TEST(SafetensorsModelTest, OpensAllMiniLmL6V2) {
  const std::string path = std::string(ATTN_TEST_MODEL_DIR) + "/model.safetensors";
  ASSERT_EQ(access(path.c_str(), R_OK), 0) << "model not installed (scripts/setup.sh): " << path;
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  // 5 embedding tensors + position_ids, 16 per layer x 6 layers, 2 pooler tensors.
  EXPECT_EQ(f.tensors().size(), 104u);
  EXPECT_EQ(f.metadata().at("format"), "pt");

  const TensorInfo* words = f.Find("embeddings.word_embeddings.weight");
  ASSERT_NE(words, nullptr);
  EXPECT_EQ(words->dtype, DType::kF32);
  EXPECT_EQ(words->shape, (std::vector<int64_t>{30522, 384}));

  const TensorInfo* positions = f.Find("embeddings.position_ids");
  ASSERT_NE(positions, nullptr);
  EXPECT_EQ(positions->dtype, DType::kI64);
  EXPECT_EQ(positions->shape, (std::vector<int64_t>{1, 512}));
  const std::string_view raw = f.RawBytes(*positions);
  ASSERT_EQ(raw.size(), 512u * 8);
  for (int64_t i = 0; i < 512; ++i) {
    int64_t v;
    std::memcpy(&v, raw.data() + i * 8, 8);
    ASSERT_EQ(v, i);
  }
  ExpectError(f.ReadFloat32("embeddings.position_ids"), absl::StatusCode::kInvalidArgument,
              "tensor 'embeddings.position_ids': dtype I64");

  auto ln = f.ReadFloat32("encoder.layer.5.output.LayerNorm.weight");
  ASSERT_TRUE(ln.ok()) << ln.status();
  EXPECT_EQ(ln->shape(), (std::vector<int64_t>{384}));
  for (float v : ln->values()) ASSERT_TRUE(std::isfinite(v));

  for (const TensorInfo& info : f.tensors()) {
    if (info.dtype != DType::kF32) continue;
    auto t = f.ReadFloat32(info.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->shape(), info.shape) << info.name;
  }
}

}  // namespace
}  // namespace attn
