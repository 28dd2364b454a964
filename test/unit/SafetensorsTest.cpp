//===- SafetensorsTest.cpp - the runtime's safetensors reader -------------===//

#include "runtime/Safetensors.h"

#include <cstring>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <random>

using namespace moe::rt;
using ::testing::HasSubstr;

namespace {
/// A file built byte by byte, as the format defines it.
std::vector<uint8_t> rawFile(const std::string &header,
                             const std::vector<uint8_t> &data) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::string parseError(std::vector<uint8_t> bytes) {
  std::string error;
  auto file = SafetensorsFile::parse(std::move(bytes), "in.safetensors", error);
  EXPECT_EQ(file == nullptr, !error.empty());
  return error;
}

/// The error for a file with JSON `header` and `dataBytes` bytes of data.
std::string headerError(const std::string &header, size_t dataBytes) {
  return parseError(rawFile(header, std::vector<uint8_t>(dataBytes)));
}
} // namespace

TEST(Safetensors, ReadsTheFormatAsSpecified) {
  std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";
  std::string error;
  auto file = SafetensorsFile::parse(rawFile(header, data), "x", error);
  ASSERT_TRUE(file) << error;
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), 2u);
  const TensorInfo *a = file->find("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->dtype, DType::BF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->bytes, 8u);
  EXPECT_EQ(file->data(*a)[0], 1);
  const TensorInfo *b = file->find("b");
  ASSERT_TRUE(b);
  EXPECT_EQ(file->data(*b)[3], 12);
  EXPECT_EQ(file->find("c"), nullptr);
}

TEST(Safetensors, RoundTripsEveryDTypeAndEmptyTensors) {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000};
  std::vector<uint8_t> e8m0 = {127, 128, 255};
  std::vector<TensorToWrite> tensors = {
      {"hidden_states", DType::BF16, {0, 7168}, nullptr},
      {"w", DType::F32, {3}, f32.data()},
      {"x", DType::BF16, {1, 2}, bf16.data()},
      {"scales", DType::F8_E8M0, {3}, e8m0.data()},
      {"quoted \"name\"", DType::F8_E4M3, {3}, e8m0.data()},
  };
  std::string error;
  auto file = SafetensorsFile::parse(encodeSafetensors(tensors), "x", error);
  ASSERT_TRUE(file) << error;
  ASSERT_EQ(file->tensors().size(), tensors.size());
  const TensorInfo *empty = file->find("hidden_states");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->numElements(), 0);
  EXPECT_EQ(std::memcmp(file->data(*file->find("w")), f32.data(), 12), 0);
  EXPECT_EQ(std::memcmp(file->data(*file->find("x")), bf16.data(), 4), 0);
  EXPECT_EQ(file->data(*file->find("scales"))[2], 255);
  EXPECT_TRUE(file->find("quoted \"name\""));
}

TEST(Safetensors, NamesWhatIsWrongWithABadFile) {
  EXPECT_THAT(parseError({1, 2, 3}),
              HasSubstr("shorter than its 8-byte header size"));
  std::vector<uint8_t> huge = rawFile("{}", {});
  huge[7] = 0x7f;
  EXPECT_THAT(parseError(huge), HasSubstr("runs past the end of the file"));
  EXPECT_THAT(headerError(R"({"a":)", 0), HasSubstr("bad JSON header"));
  EXPECT_THAT(headerError("[]", 0), HasSubstr("must be a JSON object"));
  EXPECT_THAT(
      headerError(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                  8),
      HasSubstr("tensor 'a' has unsupported dtype 'F64'"));
  EXPECT_THAT(
      headerError(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                  4),
      HasSubstr("not a non-negative integer"));
  EXPECT_THAT(
      headerError(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                  4),
      HasSubstr(
          "tensor 'a' holds 4 bytes, but its dtype and shape need 2 x 4"));
  EXPECT_THAT(
      headerError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})",
                  4),
      HasSubstr("outside the 4-byte data section"));
  EXPECT_THAT(headerError(R"({"a":{"dtype":"F32",)"
                          R"("shape":[4611686018427387904,4],)"
                          R"("data_offsets":[0,4]}})",
                          4),
              HasSubstr("too large"));
  EXPECT_THAT(
      headerError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                  4),
      HasSubstr("appears twice"));
  EXPECT_THAT(headerError(std::string(100, '[') + std::string(100, ']'), 0),
              HasSubstr("nested too deeply"));
  std::string error;
  EXPECT_FALSE(SafetensorsFile::read("/nonexistent/in.safetensors", error));
  EXPECT_THAT(error, HasSubstr("cannot open"));
}

// Random corruption of a valid file: always an answer, never a crash, and a
// file that still parses describes only bytes inside it.
TEST(Safetensors, SurvivesRandomCorruption) {
  std::vector<float> values(64, 1.0f);
  std::vector<uint8_t> good =
      encodeSafetensors({{"a", DType::F32, {8, 8}, values.data()},
                         {"b", DType::BF16, {4, 8}, values.data()}});
  std::mt19937 rng(42);
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<uint8_t> bytes = good;
    switch (trial % 3) {
    case 0:
      bytes.resize(rng() % bytes.size());
      break;
    case 1:
      for (int flips = 1 + rng() % 4; flips > 0; --flips)
        bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
      break;
    default:
      bytes[8 + rng() % 60] = "{}[]\",:0-9e"[rng() % 11];
      break;
    }
    size_t size = bytes.size();
    std::string error;
    auto file = SafetensorsFile::parse(std::move(bytes), "x", error);
    if (!file) {
      EXPECT_FALSE(error.empty());
      continue;
    }
    for (const TensorInfo &tensor : file->tensors())
      EXPECT_LE(file->data(tensor) + tensor.bytes,
                file->data(file->tensors()[0]) - file->tensors()[0].offset +
                    size);
  }
}
