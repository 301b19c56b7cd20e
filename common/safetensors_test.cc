// Tests of common/safetensors: round trips, the committed fixture
// testdata/tiny.safetensors (testdata/gen_tiny_safetensors.py), byte strings
// asserted by the reference implementation's own tests, durability of the
// writer, and a battery of corrupted files.
#include "common/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace pstrain {
namespace safetensors {
namespace {

namespace fs = std::filesystem;

std::string TempDir(absl::string_view name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                       absl::StrCat("safetensors_test_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteBytes(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

uint32_t Crc32(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file of `header` (padded with spaces to a multiple of 8) and `data`.
std::string Craft(absl::string_view header, absl::string_view data) {
  std::string text(header);
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return absl::StrCat(Le64(text.size()), text, data);
}

template <typename T>
absl::string_view Bytes(const std::vector<T>& values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(T));
}

// The error contract: not OK, one line, naming the file.
void ExpectOneLineError(const absl::Status& status, const std::string& path,
                        const std::string& label) {
  ASSERT_FALSE(status.ok()) << label;
  const std::string message(status.message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << label << ": " << message;
  EXPECT_EQ(message.find('\r'), std::string::npos) << label << ": " << message;
  EXPECT_NE(message.find(path), std::string::npos) << label << ": " << message;
}

TEST(SafetensorsTest, DtypeNamesAndSizes) {
  EXPECT_EQ(DtypeName(Dtype::kF32), "F32");
  EXPECT_EQ(DtypeSize(Dtype::kF32), 4);
  EXPECT_EQ(DtypeSize(Dtype::kI64), 8);
  EXPECT_EQ(DtypeSize(Dtype::kBF16), 2);
  EXPECT_EQ(ParseDtype("I64"), Dtype::kI64);
  EXPECT_EQ(ParseDtype("F8_E4M3"), Dtype::kF8E4M3);
  EXPECT_FALSE(ParseDtype("F4").has_value());
  EXPECT_FALSE(ParseDtype("f32").has_value());
  EXPECT_EQ(ShapeString({6, 1, 5, 5}), "[6,1,5,5]");
  EXPECT_EQ(ShapeString({}), "[]");
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::string dir = TempDir("round_trip");
  const std::string path = dir + "/shard-0.safetensors";
  const std::vector<float> weight = {1.5f, -2.0f, 0.0f, -0.0f, 1e-38f, 3.25f};
  const std::vector<int64_t> positions = {0, -1, INT64_MAX, INT64_MIN};
  const std::vector<float> empty;
  const std::vector<int64_t> step = {200};
  const std::vector<float> lr = {0.001f};
  const std::vector<double> f64 = {3.141592653589793, -1e300};
  const std::vector<TensorView> tensors = {
      F32View("layer.0.weight", {2, 3}, weight),
      I64View("data.position", {4}, positions),
      F32View("empty", {3, 0}, empty),
      I64View("optimizer.step", {}, step),
      F32View("lr", {}, lr),
      TensorView{"f64", Dtype::kF64, {2}, Bytes(f64)},
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "line\nbreak \"quoted\" caf\u00e9"}};

  const absl::StatusOr<WriteResult> written = Write(path, tensors, metadata);
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(written->size_bytes, bytes.size());
  EXPECT_EQ(written->crc32, Crc32(bytes));

  ReadOptions options;
  options.size_bytes = written->size_bytes;
  options.crc32 = written->crc32;
  absl::StatusOr<File> file = File::Read(path, options);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->size_bytes(), bytes.size());
  EXPECT_EQ(file->crc32(), written->crc32);
  EXPECT_EQ(file->metadata(), metadata);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = file->tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.dtype, tensors[i].dtype);
    EXPECT_EQ(t.shape, tensors[i].shape);
    EXPECT_EQ(t.bytes, tensors[i].bytes) << t.name;
  }
  EXPECT_EQ(file->tensors()[2].num_elements, 0);
  EXPECT_EQ(file->tensors()[3].num_elements, 1);

  const absl::StatusOr<std::vector<float>> floats =
      file->ReadFloats("layer.0.weight", {2, 3});
  ASSERT_TRUE(floats.ok()) << floats.status();
  EXPECT_EQ(*floats, weight);
  EXPECT_EQ(*file->ReadFloats("lr", {}), lr);
  EXPECT_TRUE(file->ReadFloats("empty", {3, 0})->empty());
  const absl::StatusOr<const Tensor*> step_tensor =
      file->Get("optimizer.step", Dtype::kI64, {});
  ASSERT_TRUE(step_tensor.ok()) << step_tensor.status();
  int64_t step_value = 0;
  std::memcpy(&step_value, (*step_tensor)->bytes.data(), 8);
  EXPECT_EQ(step_value, 200);

  // A File moved keeps its tensors' bytes valid.
  File moved = *std::move(file);
  EXPECT_EQ(moved.Find("f64")->bytes, Bytes(f64));
  EXPECT_EQ(moved.Find("nope"), nullptr);

  // Asking for the wrong shape, dtype or name.
  absl::StatusOr<std::vector<float>> wrong =
      moved.ReadFloats("layer.0.weight", {3, 2});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            path + ": tensor 'layer.0.weight' has shape [2,3], expected [3,2]");
  wrong = moved.ReadFloats("optimizer.step", {});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            path + ": tensor 'optimizer.step' is I64, expected F32");
  wrong = moved.ReadFloats("conv9.weight", {1});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(wrong.status().message(),
            path + ": no tensor 'conv9.weight' (the file has 6 tensors)");

  // Writing again replaces the file as a whole.
  const std::vector<float> other = {7.0f};
  ASSERT_TRUE(Write(path, {F32View("x", {1}, other)}).ok());
  const absl::StatusOr<File> again = File::Read(path);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->tensors().size(), 1u);
  EXPECT_TRUE(again->metadata().empty());
  EXPECT_EQ(*again->ReadFloats("x", {1}), other);
}

TEST(SafetensorsTest, EmptyFileOfNoTensors) {
  const std::string path = TempDir("empty") + "/none.safetensors";
  ASSERT_TRUE(Write(path, {}).ok());
  const absl::StatusOr<File> file = File::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors().empty());
  EXPECT_TRUE(file->metadata().empty());
}

// Byte strings that the reference implementation's own tests assert as its
// serializer's output (huggingface/safetensors, safetensors/src/tensor.rs,
// tests `test_serialization` and `test_empty`).
TEST(SafetensorsTest, WriterMatchesReferenceSerializerBytes) {
  const std::string dir = TempDir("reference");
  {
    const std::vector<float> values = {0, 1, 2, 3, 4, 5};
    const std::string path = dir + "/attn.safetensors";
    ASSERT_TRUE(Write(path, {F32View("attn.0", {1, 2, 3}, values)}).ok());
    const unsigned char expected[] = {
        64,  0,   0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110,
        46,  48,  34,  58,  123, 34,  100, 116, 121, 112, 101, 34,  58,  34,
        70,  51,  50,  34,  44,  34,  115, 104, 97,  112, 101, 34,  58,  91,
        49,  44,  50,  44,  51,  93,  44,  34,  100, 97,  116, 97,  95,  111,
        102, 102, 115, 101, 116, 115, 34,  58,  91,  48,  44,  50,  52,  93,
        125, 125, 0,   0,   0,   0,   0,   0,   128, 63,  0,   0,   0,   64,
        0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
    EXPECT_EQ(
        ReadBytes(path),
        std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));
  }
  {
    const std::string path = dir + "/empty.safetensors";
    ASSERT_TRUE(Write(path, {}).ok());
    const unsigned char expected[] = {8,   0,   0,  0,  0,  0,  0,  0,
                                      123, 125, 32, 32, 32, 32, 32, 32};
    EXPECT_EQ(
        ReadBytes(path),
        std::string(reinterpret_cast<const char*>(expected), sizeof(expected)));
  }
}

// The tensors of testdata/gen_tiny_safetensors.py, in the file's order.
struct FixtureTensors {
  std::vector<int64_t> position = {1, -37, 12345678901};
  std::vector<int64_t> step = {200};
  std::vector<double> scale = {1.0 / 3.0, -2.5, 1e-300};
  std::vector<float> bias = {0.5f, -1.5f};
  std::vector<float> weight;
  std::vector<float> empty;
  std::vector<float> unicode = {0x1p100f};

  FixtureTensors() {
    for (int i = 0; i < 18; ++i) weight.push_back((i - 9) * 0.25f);
  }
  std::vector<TensorView> Views() const {
    return {
        I64View("data.position", {3}, position),
        I64View("optimizer.step", {}, step),
        TensorView{"fc.scale", Dtype::kF64, {3}, Bytes(scale)},
        F32View("conv1.bias", {2}, bias),
        F32View("conv1.weight", {2, 1, 3, 3}, weight),
        F32View("empty", {0, 4}, empty),
        F32View("unicode.\u00e9", {1}, unicode),
    };
  }
  std::map<std::string, std::string> Metadata() const {
    return {{"format", "pt"}, {"step", "200"}};
  }
};

constexpr char kFixture[] = "testdata/tiny.safetensors";

TEST(SafetensorsTest, ReadsFixture) {
  const std::string bytes = ReadBytes(kFixture);
  ASSERT_EQ(bytes.size(), 8u + 512u + 140u) << "missing or changed fixture";
  ReadOptions options;
  options.size_bytes = bytes.size();
  options.crc32 = Crc32(bytes);
  options.follow_symlinks = true;  // Bazel's runfiles are links.
  const absl::StatusOr<File> file = File::Read(kFixture, options);
  ASSERT_TRUE(file.ok()) << file.status();
  const FixtureTensors expected;
  EXPECT_EQ(file->metadata(), expected.Metadata());
  const std::vector<TensorView> views = expected.Views();
  ASSERT_EQ(file->tensors().size(), views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const Tensor& t = file->tensors()[i];
    EXPECT_EQ(t.name, views[i].name);
    EXPECT_EQ(t.dtype, views[i].dtype) << t.name;
    EXPECT_EQ(t.shape, views[i].shape) << t.name;
    EXPECT_EQ(t.bytes, views[i].bytes) << t.name;
  }
  EXPECT_EQ(*file->ReadFloats("conv1.weight", {2, 1, 3, 3}), expected.weight);
  EXPECT_EQ(*file->ReadFloats("unicode.\u00e9", {1}), expected.unicode);
  const absl::StatusOr<std::vector<float>> wrong =
      file->ReadFloats("conv1.weight", {2, 1, 5, 5});
  EXPECT_EQ(wrong.status().message(),
            absl::StrCat(kFixture, ": tensor 'conv1.weight' has shape ",
                         "[2,1,3,3], expected [2,1,5,5]"));
}

TEST(SafetensorsTest, WriterReproducesFixtureByteForByte) {
  const std::string path = TempDir("fixture") + "/tiny.safetensors";
  const FixtureTensors fixture;
  const absl::StatusOr<WriteResult> written =
      Write(path, fixture.Views(), fixture.Metadata());
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string expected = ReadBytes(kFixture);
  EXPECT_EQ(ReadBytes(path), expected);
  EXPECT_EQ(written->size_bytes, expected.size());
  EXPECT_EQ(written->crc32, Crc32(expected));
}

TEST(SafetensorsTest, WriteRefusesBadArguments) {
  const std::string dir = TempDir("bad_args");
  const std::string path = dir + "/bad.safetensors";
  const std::vector<float> four = {1, 2, 3, 4};
  const struct {
    std::vector<TensorView> tensors;
    std::map<std::string, std::string> metadata;
    std::string message;
  } cases[] = {
      {{F32View("w", {6, 1, 5, 5}, four)},
       {},
       "tensor 'w': 16 bytes given; shape [6,1,5,5] of F32 needs 600"},
      {{F32View("w", {4}, four), F32View("w", {4}, four)},
       {},
       "tensor 'w' is given twice"},
      {{F32View("", {4}, four)}, {}, "name '' is reserved or empty"},
      {{F32View("__metadata__", {4}, four)}, {}, "is reserved or empty"},
      {{F32View("w", {-1, -4}, four)}, {}, "has a negative dimension"},
      {{F32View("w", {INT64_MAX, 2}, four)}, {}, "overflows"},
      {{F32View("bad\xff", {4}, four)}, {}, "not valid UTF-8"},
      {{}, {{"k", "\xfe"}}, "metadata 'k' is not valid UTF-8"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<WriteResult> result =
        Write(path, c.tensors, c.metadata);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    ExpectOneLineError(result.status(), path, c.message);
    EXPECT_NE(result.status().message().find(c.message), std::string::npos)
        << result.status();
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "a refused write left a file";
}

TEST(SafetensorsTest, WriterLeavesNoTemporaryFile) {
  const std::string dir = TempDir("no_temp");
  const std::vector<float> values(1000, 0.5f);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Write(dir + "/model.safetensors",
                      {F32View("w", {10, 100}, values)}, {{"i", "x"}})
                    .ok());
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(fs::status(dir + "/model.safetensors").permissions() &
                fs::perms::owner_read,
            fs::perms::owner_read);
}

TEST(SafetensorsTest, WriteToMissingFolderNamesIt) {
  const std::string folder = TempDir("missing") + "/step-200";
  const std::string path = folder + "/shard-0.safetensors";
  const std::vector<float> values = {1};
  const absl::StatusOr<WriteResult> result =
      Write(path, {F32View("w", {1}, values)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  ExpectOneLineError(result.status(), path, "missing folder");
  EXPECT_NE(result.status().message().find("folder '" + folder + "'"),
            std::string::npos)
      << result.status();
  EXPECT_FALSE(fs::exists(folder));
}

TEST(SafetensorsTest, MissingFileAndDirectory) {
  const std::string dir = TempDir("missing_file");
  const std::string path = dir + "/shard-1.safetensors";
  absl::Status status = File::Read(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  ExpectOneLineError(status, path, "missing file");
  status = File::Read(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ExpectOneLineError(status, dir, "a folder");
}

// Files, like requests, are hostile: what a damaged checkpoint or a user's
// mistake puts in place of a model file is refused at once, in one line,
// without reading it whole or allocating its size.
TEST(SafetensorsTest, RefusesLinksFifosAndDevicesWithoutHanging) {
  const std::string dir = TempDir("hostile");
  const std::string good = dir + "/good.safetensors";
  const std::vector<float> values = {1, 2};
  ASSERT_TRUE(Write(good, {F32View("w", {2}, values)}).ok());

  const std::string fifo = dir + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::Status status = File::Read(fifo).status();  // Hung in open() before.
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("FIFO"), std::string::npos) << status;
  ExpectOneLineError(status, fifo, "fifo");

  const std::string zero = dir + "/zero.safetensors";
  fs::create_symlink("/dev/zero", zero);
  ReadOptions follow;
  follow.follow_symlinks = true;
  status = File::Read(zero, follow).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("character device"), std::string::npos)
      << status;
  status = File::Read(zero).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("symbolic link"), std::string::npos)
      << status;

  // A link to a regular file: refused by default, read when followed.
  const std::string link = dir + "/link.safetensors";
  fs::create_symlink(good, link);
  EXPECT_EQ(File::Read(link).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(File::Read(link, follow).ok());
}

TEST(SafetensorsTest, HugeSparseFileIsRefusedBeforeAllocation) {
  const std::string dir = TempDir("sparse");
  // truncate -s 8T: zeros (header length 0), then a valid file whose size
  // the header does not account for. Both were read whole into an 8 TB
  // buffer (std::bad_alloc: abort) before.
  constexpr off_t kEightTerabytes = off_t{8} << 40;
  const std::string zeros = dir + "/zeros.safetensors";
  WriteBytes(zeros, "");
  if (::truncate(zeros.c_str(), kEightTerabytes) != 0) {
    GTEST_SKIP() << "this file system has no 8 TB sparse files";
  }
  absl::Status status = File::Read(zeros).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  ExpectOneLineError(status, zeros, "8 TB of zeros");

  const std::string padded = dir + "/padded.safetensors";
  const std::vector<float> values = {1, 2};
  ASSERT_TRUE(Write(padded, {F32View("w", {2}, values)}).ok());
  ASSERT_EQ(::truncate(padded.c_str(), kEightTerabytes), 0);
  ReadOptions no_cap;
  no_cap.max_size_bytes = ~uint64_t{0};
  status = File::Read(padded, no_cap).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("trailing bytes"), std::string::npos)
      << status;

  // Over the reader's cap: refused before a byte is read.
  ReadOptions small;
  small.max_size_bytes = 1000;
  status = File::Read(padded, small).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("more than the 1000"), std::string::npos)
      << status;
}

TEST(SafetensorsTest, WrittenFilesFollowTheUmask) {
  const std::string dir = TempDir("umask");
  const std::vector<float> values = {1};
  for (const mode_t mask : {mode_t{022}, mode_t{077}, mode_t{027}}) {
    const mode_t old = ::umask(mask);
    const std::string path = absl::StrCat(dir, "/m", mask, ".safetensors");
    const absl::StatusOr<WriteResult> written =
        Write(path, {F32View("w", {1}, values)});
    ::umask(old);
    ASSERT_TRUE(written.ok()) << written.status();
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask) << "umask " << mask;
  }
}

// Crafted headers: each names its problem.
TEST(SafetensorsTest, RejectsMalformedHeadersWithTheirProblem) {
  const std::string path = TempDir("malformed") + "/ckpt-shard-0.safetensors";
  const std::string f4(4, 'x');
  const std::string f8(8, 'x');
  const std::string f12(12, 'x');
  auto entry = [](const std::string& name, const std::string& body) {
    return absl::StrCat("\"", name, "\":{", body, "}");
  };
  const std::string a4 =
      entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])");
  const struct {
    std::string file;
    std::string message;
  } cases[] = {
      {"", "file is 0 bytes, shorter than the 8-byte header length"},
      {std::string("\x08\0\0\0\0\0\0", 7),
       "file is 7 bytes, shorter than the 8-byte"},
      {Le64(100) + "{}",
       "header length 100 bytes runs past the end of the "
       "10-byte file"},
      {Le64(100'000'001) + "{}", "header length 100000001 bytes exceeds"},
      {Le64(~uint64_t{0}) + "{}", "exceeds the limit of 100000000"},
      {Le64(0), "header does not begin with '{'"},
      {Craft("[]", ""), "header does not begin with '{'"},
      {Craft(" {}", ""), "header does not begin with '{'"},
      {Craft("{", ""), "header is not valid JSON"},
      {Craft("{}x", ""), "header is not valid JSON"},
      // nlohmann's parser takes a NUL for the end of its input.
      {Le64(8) + std::string("{}\0\0\0\0\0\0", 8),
       "header has a NUL byte at offset 2"},
      {Craft(std::string("{}\0{\"x\":1}", 10), ""),
       "header has a NUL byte at offset 2"},
      {Craft("{\"a\xff\":1}", ""), "not valid JSON"},
      {Craft("{\"a\nb\":1}", ""), "not valid JSON"},
      {Craft("{\"a\":1}", ""), "tensor 'a': entry is not a JSON object"},
      {Craft("{" + entry("a", R"("shape":[1],"data_offsets":[0,4])") + "}", f4),
       "tensor 'a': no \"dtype\""},
      {Craft("{" + entry("a", R"("dtype":"F32","data_offsets":[0,4])") + "}",
             f4),
       "tensor 'a': no \"shape\""},
      {Craft("{" + entry("a", R"("dtype":"F32","shape":[1])") + "}", f4),
       "tensor 'a': no \"data_offsets\""},
      {Craft("{" +
                 entry("a", R"("dtype":32,"shape":[1],"data_offsets":[0,4])") +
                 "}",
             f4),
       "\"dtype\" is not a string: 32"},
      {Craft(
           "{" +
               entry("a", R"("dtype":"F33","shape":[1],"data_offsets":[0,4])") +
               "}",
           f4),
       "unknown or unsupported dtype \"F33\""},
      {Craft(
           "{" +
               entry("a", R"("dtype":"F4","shape":[8],"data_offsets":[0,4])") +
               "}",
           f4),
       "unknown or unsupported dtype \"F4\""},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":4,"data_offsets":[0,4])") +
                 "}",
             f4),
       "\"shape\" is not an array: 4"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])") +
                 "}",
             f4),
       "shape [-1] has a dimension that is not an integer"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":[1.0],"data_offsets":[0,4])") +
                 "}",
             f4),
       "has a dimension that is not an integer"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":["1"],"data_offsets":[0,4])") +
                 "}",
             f4),
       "has a dimension that is not an integer"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":[9223372036854775808],)"
                            R"("data_offsets":[0,4])") +
                 "}",
             f4),
       "has a dimension that is not an integer"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":[4294967296,4294967296],)"
                            R"("data_offsets":[0,4])") +
                 "}",
             f4),
       "shape [4294967296,4294967296] of F32 overflows"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0])") +
                 "}",
             f4),
       "\"data_offsets\" is not a pair of non-negative integers: [0]"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])") +
                 "}",
             f4),
       "is not a pair of non-negative integers: [-4,0]"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":[1],"data_offsets":[0,4,8])") +
                 "}",
             f4),
       "is not a pair"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":[1],"data_offsets":"0")") +
                 "}",
             f4),
       "is not a pair"},
      {Craft(
           "{" +
               entry("a", R"("dtype":"F32","shape":[0],"data_offsets":[4,0])") +
               "}",
           f4),
       "data_offsets [4, 0] begin after they end"},
      {Craft("{" + a4 + "}", ""),
       "tensor 'a': data_offsets [0, 4] run past the end of the 0-byte data"},
      {Craft(
           "{" +
               entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,8])") +
               "}",
           f8),
       "tensor 'a': data_offsets [0, 8] hold 8 bytes; shape [1] of F32 needs "
       "4"},
      {Craft("{" +
                 entry("w", R"("dtype":"F32","shape":[6,1,5,5],)"
                            R"("data_offsets":[0,100])") +
                 "}",
             std::string(100, 'x')),
       "tensor 'w': data_offsets [0, 100] hold 100 bytes; shape [6,1,5,5] of "
       "F32 needs 600"},
      {Craft("{" + a4 + "," +
                 entry("b",
                       R"("dtype":"F32","shape":[2],"data_offsets":[2,10])") +
                 "}",
             f12),
       "tensor 'b': data_offsets [2, 10] overlap tensor 'a'"},
      {Craft("{" + a4 + "," +
                 entry("b",
                       R"("dtype":"F32","shape":[1],"data_offsets":[8,12])") +
                 "}",
             f12),
       "bytes [4, 8) of the data buffer belong to no tensor (before 'b')"},
      {Craft(
           "{" +
               entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") +
               "}",
           f8),
       "bytes [0, 4) of the data buffer belong to no tensor"},
      {Craft("{" + a4 + "}", f8),
       "bytes [4, 8) of the data buffer belong to "
       "no tensor (trailing bytes)"},
      {Craft("{" + a4 + "," + a4 + "}", f8), "header has the key 'a' twice"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","dtype":"F32","shape":[1],)"
                            R"("data_offsets":[0,4])") +
                 "}",
             f4),
       "header has the key 'dtype' twice"},
      {Craft(R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})", ""),
       "header has the key '__metadata__' twice"},
      {Craft("{" +
                 entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4],)"
                            R"("offset":0)") +
                 "}",
             f4),
       "tensor 'a': unknown field 'offset'"},
      {Craft("{" +
                 entry("a",
                       R"("dtype":"F32","shape":[[1]],"data_offsets":[0,4])") +
                 "}",
             f4),
       "header nests deeper than 3 levels"},
      {Craft(R"({"a":{"dtype":"F32","shape":")" + std::string(5000, 'x') +
                 R"(","data_offsets":[0,4]}})",
             f4),
       "\"shape\" is not an array: \"" + std::string(63, 'x') + "..."},
      {Craft(R"({"__metadata__":[1]})", ""),
       "__metadata__ is not a JSON object"},
      {Craft(R"({"__metadata__":{"step":200}})", ""),
       "__metadata__ 'step' is not a string: 200"},
      {Craft(R"({"a\nb":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
             f4),
       "tensor 'a\\x0ab': data_offsets [0, 4] hold 4 bytes; shape [2] of F32 "
       "needs 8"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    WriteBytes(path, c.file);
    const absl::Status status = File::Read(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    ExpectOneLineError(status, path, c.message);
    EXPECT_EQ(status.message().rfind(path + ": ", 0), 0u) << status;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
  }
}

// At least 1,000 corrupted versions of the fixture: each must be refused
// with a one-line error naming the file, never accepted and never a crash.
TEST(SafetensorsTest, CorruptionBattery) {
  const std::string good = ReadBytes(kFixture);
  ASSERT_FALSE(good.empty());
  const uint64_t header_size = 512;
  const uint64_t data_begin = 8 + header_size;
  ReadOptions manifest;
  manifest.size_bytes = good.size();
  manifest.crc32 = Crc32(good);
  const ReadOptions none;
  const std::string path = TempDir("battery") + "/step-200/shard-0.safetensors";
  fs::create_directories(fs::path(path).parent_path());

  int refused = 0;
  auto expect_refused = [&](const std::string& label, const std::string& bytes,
                            const ReadOptions& options) {
    WriteBytes(path, bytes);
    const absl::Status status = File::Read(path, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << label;
    ExpectOneLineError(status, path, label);
    ++refused;
  };

  // Truncation at every length, with and without the manifest.
  for (size_t n = 0; n < good.size(); ++n) {
    expect_refused(absl::StrCat("truncated to ", n), good.substr(0, n), none);
    expect_refused(absl::StrCat("truncated to ", n, " (manifest)"),
                   good.substr(0, n), manifest);
  }
  // Every bit of the header length, and every bit of the data: the data's
  // flips are caught by the crc32.
  for (size_t bit = 0; bit < 64; ++bit) {
    std::string bytes = good;
    bytes[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    expect_refused(absl::StrCat("length bit ", bit), bytes, none);
  }
  for (size_t i = data_begin; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bytes = good;
      bytes[i] ^= static_cast<char>(1 << bit);
      expect_refused(absl::StrCat("data byte ", i, " bit ", bit), bytes,
                     manifest);
    }
  }
  // Every bit of the JSON. With the manifest every flip is refused. Without
  // it, a flip may still make a valid file (a letter of a name or of
  // metadata changes, or the shape of a tensor of no elements), but never
  // one with other dtypes or bytes.
  int accepted_without_manifest = 0;
  const FixtureTensors fixture;
  for (size_t i = 8; i < data_begin; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bytes = good;
      bytes[i] ^= static_cast<char>(1 << bit);
      const std::string label = absl::StrCat("header byte ", i, " bit ", bit);
      expect_refused(label, bytes, manifest);
      WriteBytes(path, bytes);
      const absl::StatusOr<File> file = File::Read(path);
      if (!file.ok()) {
        ExpectOneLineError(file.status(), path, label);
        continue;
      }
      ++accepted_without_manifest;
      const std::vector<TensorView> views = fixture.Views();
      ASSERT_EQ(file->tensors().size(), views.size()) << label;
      for (size_t t = 0; t < views.size(); ++t) {
        const Tensor& got = file->tensors()[t];
        EXPECT_EQ(got.dtype, views[t].dtype) << label;
        EXPECT_EQ(got.bytes, views[t].bytes) << label;
        // A tensor of no elements can change shape ([0,4] -> [0,5]) and
        // still be valid: only the manifest's crc32 catches that.
        if (got.num_elements > 0) {
          EXPECT_EQ(got.shape, views[t].shape) << label;
        }
      }
    }
  }
  EXPECT_LT(accepted_without_manifest, 8 * 200);
  // Wrong header lengths.
  for (const int64_t delta : {-512, -9, -8, -7, -1, 1, 7, 8, 9, 140, 141}) {
    std::string bytes = good;
    bytes.replace(0, 8, Le64(header_size + delta));
    expect_refused(absl::StrCat("header length ", header_size + delta), bytes,
                   none);
  }
  for (const uint64_t n : {uint64_t{1} << 63, ~uint64_t{0}, uint64_t{1} << 32,
                           uint64_t{100'000'001}}) {
    std::string bytes = good;
    bytes.replace(0, 8, Le64(n));
    expect_refused(absl::StrCat("header length ", n), bytes, none);
  }
  // Trailing garbage, a missing tail byte, a byte inserted.
  for (const std::string& tail :
       {std::string("x"), std::string(8, '\0'), std::string(4096, 'z')}) {
    expect_refused("trailing garbage", good + tail, none);
    expect_refused("trailing garbage (manifest)", good + tail, manifest);
  }
  expect_refused(
      "byte inserted in data",
      good.substr(0, data_begin + 10) + "!" + good.substr(data_begin + 10),
      none);
  // The manifest disagrees with a valid file.
  {
    ReadOptions wrong_size = manifest;
    *wrong_size.size_bytes += 1;
    expect_refused("manifest size", good, wrong_size);
    ReadOptions wrong_crc = manifest;
    *wrong_crc.crc32 ^= 1;
    expect_refused("manifest crc", good, wrong_crc);
  }
  // A missing file.
  const absl::Status missing = File::Read(path + ".missing", manifest).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  ExpectOneLineError(missing, path + ".missing", "missing file");
  ++refused;

  EXPECT_GE(refused, 1000);
  std::printf(
      "corruption battery: %d files refused; %d header bit flips "
      "accepted without a manifest (names, metadata, shapes of no elements)\n",
      refused, accepted_without_manifest);
}

}  // namespace
}  // namespace safetensors
}  // namespace pstrain
