// Initial values from safetensors files written by hand, as another tool writes them:
// F32, BF16 and F16 are read and converted to fp32; every mismatch with the model is
// named; a file that is not safetensors is Corruption.
#include "zero/safetensors_init.h"

#include <gmock/gmock.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/half.h"

namespace strata::zero {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::string Write(const std::string& name, const std::vector<Tensor>& tensors, int64_t shift = 0) {
  const std::string path = (fs::temp_directory_path() / ("strata-st-" + name + ".safetensors")).string();
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<uint8_t> data;
  for (const Tensor& t : tensors) {
    const int64_t begin = static_cast<int64_t>(data.size()) + shift;
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {begin, begin + static_cast<int64_t>(t.bytes.size())}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>((text.size() >> (8 * b)) & 0xff));
  out << text;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return path;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

ModelDecl Model() {
  ModelDecl m;
  m.tensors = {{"a", {2, 2}, std::nullopt}, {"b", {3}, std::nullopt}, {"c", {2}, std::nullopt}};
  m.modules = {{"m", {0, 1, 2}}};
  return m;
}

TEST(SafetensorsInit, ReadsF32Bf16AndF16AsFp32) {
  std::vector<uint16_t> bf16, fp16;
  for (float f : {1.5f, -2.0f, 0.25f}) bf16.push_back(FloatToBf16(f).bits);
  for (float f : {3.0f, -0.5f}) fp16.push_back(FloatToFp16(f).bits);
  const std::string path = Write("dtypes", {{"c", "F16", {2}, Bytes(fp16)},
                                            {"a", "F32", {2, 2}, Bytes(std::vector<float>{1, 2, 3, 4})},
                                            {"b", "BF16", {3}, Bytes(bf16)}});
  auto init = OpenSafetensorsInit(path, Model());
  ASSERT_TRUE(init.ok()) << init.status().ToString();
  EXPECT_EQ(init->tensors, 3);
  std::vector<float> out(4);
  init->init(0, 1, 3, out.data());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), (std::vector<float>{2, 3, 4}));
  init->init(1, 0, 3, out.data());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), (std::vector<float>{1.5f, -2.0f, 0.25f}));
  init->init(2, 0, 2, out.data());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 2), (std::vector<float>{3.0f, -0.5f}));
  EXPECT_TRUE(init->read_error->ok());
}

TEST(SafetensorsInit, NamesEveryMismatch) {
  const std::string path = Write("mismatch", {{"a", "F32", {4}, Bytes(std::vector<float>(4))},
                                              {"b", "I64", {3}, Bytes(std::vector<int64_t>(3))},
                                              {"d", "F32", {1}, Bytes(std::vector<float>(1))}});
  auto init = OpenSafetensorsInit(path, Model());
  ASSERT_EQ(init.status().code(), StatusCode::kInvalidArgument) << init.status().ToString();
  const std::string& msg = init.status().message();
  EXPECT_THAT(msg, HasSubstr("\"a\": [4] in the file, the model's is [2, 2]"));
  EXPECT_THAT(msg, HasSubstr("\"b\": dtype I64 (F32, BF16 and F16 are read)"));
  EXPECT_THAT(msg, HasSubstr("\"c\" [2]: not in the file"));
  EXPECT_THAT(msg, HasSubstr("\"d\" [1]: not a tensor of the model"));
}

TEST(SafetensorsInit, AFileThatIsNotSafetensorsIsCorruption) {
  auto missing = OpenSafetensorsInit("/nonexistent/strata.safetensors", Model());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  const std::string junk = (fs::temp_directory_path() / "strata-st-junk.safetensors").string();
  std::ofstream(junk) << "hello";
  auto short_file = OpenSafetensorsInit(junk, Model());
  EXPECT_EQ(short_file.status().code(), StatusCode::kCorruption) << short_file.status().ToString();
  EXPECT_THAT(short_file.status().message(), HasSubstr("not a safetensors file"));
  // Offsets past the data, and a size that is not dtype x shape.
  auto past =
      OpenSafetensorsInit(Write("past", {{"a", "F32", {2, 2}, Bytes(std::vector<float>(4))}}, 8), Model());
  EXPECT_EQ(past.status().code(), StatusCode::kCorruption) << past.status().ToString();
  EXPECT_THAT(past.status().message(), HasSubstr("lies outside the data"));
  auto sized =
      OpenSafetensorsInit(Write("sized", {{"a", "F32", {2, 2}, Bytes(std::vector<float>(3))}}), Model());
  EXPECT_EQ(sized.status().code(), StatusCode::kCorruption) << sized.status().ToString();
  EXPECT_THAT(sized.status().message(), HasSubstr("holds 12 bytes, its F32 [2, 2] needs 16"));
}

}  // namespace
}  // namespace strata::zero
