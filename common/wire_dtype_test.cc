#include "common/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/chunk_message.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace {

uint32_t ToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// testdata/wire_dtype_fixture.txt (testdata/gen_wire_dtype_fixture.py,
// PyTorch 1.13): every value's bfloat16 and float16 bits as
// `to(torch.bfloat16)` and `to(torch.float16)` give them, which the wire's
// conversions must equal bit for bit (a NaN only has to stay a NaN: none is
// ever sent).
TEST(WireDtypeTest, ConversionsEqualPyTorchsBitForBit) {
  std::ifstream file("testdata/wire_dtype_fixture.txt");
  ASSERT_TRUE(file) << "missing testdata/wire_dtype_fixture.txt";
  std::string line;
  int checked = 0, nans = 0;
  while (std::getline(file, line)) {
    uint32_t fp32 = 0;
    unsigned bf16 = 0, fp16 = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%x %x %x", &fp32, &bf16, &fp16), 3)
        << line;
    const float value = FromBits(fp32);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(value)))) << line;
      EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(value)))) << line;
      ++nans;
      continue;
    }
    ASSERT_EQ(FloatToBfloat16(value), bf16) << line;
    ASSERT_EQ(FloatToFloat16(value), fp16) << line;
    // Widening is exact: the 16-bit value read back as fp32 is the value
    // PyTorch's `.float()` gives.
    EXPECT_EQ(FloatToBfloat16(Bfloat16ToFloat(bf16)), bf16) << line;
    ++checked;
  }
  EXPECT_GT(checked, 19000);
  EXPECT_GT(nans, 0);
}

// The bulk conversions (vectorized where the CPU allows) give the same
// bits as the one-value functions above: the fixture's values in one span
// at scale 0, and random chunks at their own scales, whatever the length.
TEST(WireDtypeTest, BulkConversionsEqualOneValueAtATime) {
  std::ifstream file("testdata/wire_dtype_fixture.txt");
  ASSERT_TRUE(file);
  std::vector<float> values;
  std::vector<uint16_t> bf16_bits, fp16_bits;
  std::string line;
  while (std::getline(file, line)) {
    uint32_t fp32 = 0;
    unsigned bf16 = 0, fp16 = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%x %x %x", &fp32, &bf16, &fp16), 3);
    if (std::isnan(FromBits(fp32))) continue;
    values.push_back(FromBits(fp32));
    bf16_bits.push_back(bf16);
    fp16_bits.push_back(fp16);
  }
  std::vector<uint16_t> halves(values.size());
  EncodeHalves(values, DTYPE_BFLOAT16, 0, halves.data());
  EXPECT_EQ(halves, bf16_bits);
  EncodeHalves(values, DTYPE_FLOAT16, 0, halves.data());
  EXPECT_EQ(halves, fp16_bits);
  std::vector<float> widened(values.size());
  DecodeHalves(fp16_bits.data(), DTYPE_FLOAT16, 0, absl::MakeSpan(widened));
  for (size_t i = 0; i < widened.size(); ++i) {
    ASSERT_EQ(ToBits(widened[i]), ToBits(Float16ToFloat(fp16_bits[i]))) << i;
  }
  DecodeHalves(bf16_bits.data(), DTYPE_BFLOAT16, 0, absl::MakeSpan(widened));
  for (size_t i = 0; i < widened.size(); ++i) {
    ASSERT_EQ(ToBits(widened[i]), ToBits(Bfloat16ToFloat(bf16_bits[i]))) << i;
  }

  std::mt19937 random(7);
  for (size_t length : {1, 7, 8, 15, 16, 17, 1000, 4099}) {
    for (float spread : {1e-30f, 1e-3f, 1.0f, 1e6f, 1e30f}) {
      std::normal_distribution<float> normal(0.0f, spread);
      std::vector<float> chunk(length);
      for (float& v : chunk) v = normal(random);
      const int e = ScaleExponent(chunk);
      float largest = 0;
      for (float v : chunk) largest = std::max(largest, std::fabs(v));
      int k = 0;
      std::frexp(largest, &k);
      EXPECT_EQ(e, largest > 0 ? 15 - k : 0) << length << " " << spread;
      std::vector<uint16_t> bulk(length);
      std::vector<float> back(length);
      for (DType dtype : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
        const int scale = dtype == DTYPE_FLOAT16 ? e : 0;
        EncodeHalves(chunk, dtype, scale, bulk.data());
        DecodeHalves(bulk.data(), dtype, scale, absl::MakeSpan(back));
        for (size_t i = 0; i < length; ++i) {
          const uint16_t one =
              dtype == DTYPE_BFLOAT16
                  ? FloatToBfloat16(chunk[i])
                  : FloatToFloat16(std::ldexp(chunk[i], scale));
          ASSERT_EQ(bulk[i], one) << WireDtypeSpelling(dtype) << " " << i;
          const float widened_one =
              dtype == DTYPE_BFLOAT16 ? Bfloat16ToFloat(one)
                                      : std::ldexp(Float16ToFloat(one), -scale);
          ASSERT_EQ(ToBits(back[i]), ToBits(widened_one))
              << WireDtypeSpelling(dtype) << " " << i;
        }
      }
    }
  }
}

TEST(WireDtypeTest, Float16ScalesTheLargestUnder32768) {
  EXPECT_EQ(ScaleExponent({}), 0);
  EXPECT_EQ(ScaleExponent(std::vector<float>{0.0f, -0.0f}), 0);
  for (float largest :
       {1e-9f, 3e-5f, 1.0f, 16384.0f, 32767.0f, 65504.0f, 1e6f, 3e38f}) {
    const std::vector<float> values = {largest * 0.25f, -largest, 0.0f};
    const int e = ScaleExponent(values);
    const float scaled = std::ldexp(largest, e);
    EXPECT_GE(scaled, 16384.0f) << largest;
    EXPECT_LT(scaled, 32768.0f) << largest;
    // Through the wire: finite, within fp16's half-ulp (2^-11 relative).
    std::vector<float> received = values;
    RoundThroughWire(DTYPE_FLOAT16, absl::MakeSpan(received));
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(std::isfinite(received[i])) << largest;
      EXPECT_LE(std::fabs(received[i] - values[i]),
                std::fabs(values[i]) * std::ldexp(1.0f, -11))
          << largest << " " << i;
    }
  }
  // Unscaled, 1e6 would overflow to infinity and 1e-9 flush to zero.
  EXPECT_TRUE(std::isinf(Float16ToFloat(FloatToFloat16(1e6f))));
  EXPECT_EQ(Float16ToFloat(FloatToFloat16(1e-9f)), 0.0f);
}

TEST(WireDtypeTest, SpellingsParseAndPrintBack) {
  for (const char* spelling : {"fp32", "bf16", "fp16"}) {
    absl::StatusOr<DType> dtype = ParseWireDtype(spelling);
    ASSERT_TRUE(dtype.ok()) << spelling;
    EXPECT_STREQ(WireDtypeSpelling(*dtype), spelling);
  }
  EXPECT_EQ(ParseWireDtype("int8", "--wire_dtype").status().message(),
            "--wire_dtype: \"int8\"; expected fp32, bf16 or fp16");
  EXPECT_EQ(WireBytesPerElement(DTYPE_FLOAT32), 4);
  EXPECT_EQ(WireBytesPerElement(DTYPE_BFLOAT16), 2);
  EXPECT_EQ(WireBytesPerElement(DTYPE_FLOAT16), 2);
  EXPECT_EQ(WireBytesPerElement(7), 0);
}

// A chunk message in a 16-bit dtype: half the payload bytes, and the
// receiver gets exactly RoundThroughWire's values, also when the payload is
// split across slices at an odd byte (an element straddling two).
TEST(WireDtypeTest, ChunkMessagesCarryHalfTheBytesAndDecodeExactly) {
  std::vector<float> values(1001);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(static_cast<float>(i)) * 3000.0f + 0.1f;
  }
  PushPullRequest envelope;
  envelope.mutable_header()->set_job_id("job");
  for (DType dtype : {DTYPE_BFLOAT16, DTYPE_FLOAT16}) {
    grpc::ByteBuffer buffer = EncodeChunkMessage(envelope, kPushChunkField, 1,
                                                 2, 3, values, nullptr, dtype);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    // Split the message into slices of 7 bytes each.
    std::vector<grpc::Slice> pieces;
    for (size_t at = 0; at < bytes.size(); at += 7) {
      pieces.emplace_back(bytes.substr(at, 7));
    }
    grpc::ByteBuffer split(pieces.data(), pieces.size());
    ReceivedChunkMessage received;
    PushPullRequest parsed;
    ASSERT_TRUE(received.Parse(&split, kPushChunkField, &parsed).ok());
    EXPECT_EQ(received.chunk().dtype(), dtype);
    EXPECT_EQ(received.payload_bytes(), 2 * 1001);
    std::vector<float> out(values.size());
    ASSERT_TRUE(received.CopyFloatPayload(absl::MakeSpan(out)).ok());
    std::vector<float> expected = values;
    RoundThroughWire(dtype, absl::MakeSpan(expected));
    EXPECT_EQ(out, expected) << WireDtypeSpelling(dtype);
    EXPECT_NE(out, values) << "rounding changed nothing";
  }
}

TEST(WireDtypeTest, MalformedHalfChunksAreRefusedNamingTheChunk) {
  auto receive = [](const TensorChunk& chunk, std::vector<float>* out) {
    PushPullRequest request;
    *request.mutable_push() = chunk;
    const std::string bytes = request.SerializeAsString();
    const grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    ReceivedChunkMessage received;
    PushPullRequest envelope;
    absl::Status parsed = received.Parse(&buffer, kPushChunkField, &envelope);
    if (!parsed.ok()) return parsed;
    return received.CopyFloatPayload(absl::MakeSpan(*out));
  };
  TensorChunk chunk;
  chunk.mutable_key()->set_param_id(5);
  chunk.set_dtype(DTYPE_BFLOAT16);
  chunk.set_num_elements(3);
  chunk.set_data(std::string(8, '\0'));  // 4 elements' bytes
  std::vector<float> out(3);
  absl::Status status = receive(chunk, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "chunk (5, 0) carries 8 bytes for 3 bf16 elements; expected 6 "
            "bytes");
  chunk.set_data(std::string(6, '\0'));
  EXPECT_TRUE(receive(chunk, &out).ok());
  chunk.set_scale_exponent(3);  // only float16 is scaled
  EXPECT_EQ(receive(chunk, &out).message(),
            "chunk (5, 0) has scale exponent 3; expected -200 to 200 with "
            "DTYPE_FLOAT16, else 0");
  chunk.set_dtype(DTYPE_FLOAT16);
  chunk.set_scale_exponent(100000);
  EXPECT_EQ(receive(chunk, &out).code(), absl::StatusCode::kInvalidArgument);
  chunk.set_dtype(static_cast<DType>(9));
  chunk.set_scale_exponent(0);
  EXPECT_EQ(receive(chunk, &out).message(),
            "chunk (5, 0) has dtype unknown dtype 9; expected DTYPE_FLOAT32, "
            "DTYPE_BFLOAT16 or DTYPE_FLOAT16");
}

}  // namespace
}  // namespace pstrain
