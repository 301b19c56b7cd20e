#include "common/tensorboard.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "proto/tensorboard_event.pb.h"

namespace pstrain {
namespace {

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tensorboard_test_", name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A reader written from the record format alone (not ReadTfRecords):
// uint64 length, masked CRC of those 8 bytes, data, masked CRC of the data,
// little-endian; mask = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint64_t Le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  }
  return v;
}
uint32_t Mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
// Events in order; false (with a failure) at the first bad record.
bool ReadEvents(const std::string& file, std::vector<tb::Event>* events,
                std::string* error) {
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 16) {
      *error = "truncated";
      return false;
    }
    const uint64_t length = Le(file, at, 8);
    if (Le(file, at + 8, 4) != Mask(Crc32c(file.substr(at, 8)))) {
      *error = absl::StrCat("length crc at ", at);
      return false;
    }
    if (length > file.size() - at - 16) {
      *error = "truncated data";
      return false;
    }
    const std::string data = file.substr(at + 12, length);
    if (Le(file, at + 12 + length, 4) != Mask(Crc32c(data))) {
      *error = absl::StrCat("data crc at ", at);
      return false;
    }
    tb::Event event;
    if (!event.ParseFromString(data)) {
      *error = "not an Event";
      return false;
    }
    events->push_back(event);
    at += 16 + length;
  }
  return true;
}

TEST(TensorBoardTest, WritesScalarsThatReadBack) {
  const std::string dir = TestDir("scalars");
  const absl::Time start = absl::FromUnixSeconds(1700000000);
  auto writer = TensorBoardWriter::Create(dir, start);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string path = (*writer)->path();
  EXPECT_TRUE(absl::StartsWith(path, dir + "/events.out.tfevents.1700000000."))
      << path;
  ASSERT_TRUE(
      (*writer)
          ->WriteScalars(200, {{"train/loss", 0.4321f}, {"train/lr", 0.001f}},
                         start + absl::Seconds(1.5))
          .ok());
  ASSERT_TRUE(
      (*writer)
          ->WriteScalars(400, {{"train/loss", 0.25f}}, start + absl::Seconds(3))
          .ok());
  // Flushed after each event: readable before Close.
  std::vector<tb::Event> events;
  std::string error;
  ASSERT_TRUE(ReadEvents(Slurp(path), &events, &error)) << error;
  ASSERT_EQ(events.size(), 3u);
  ASSERT_TRUE((*writer)->Close().ok());

  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(events[0].wall_time(), 1700000000.0);
  EXPECT_EQ(events[1].step(), 200);
  EXPECT_DOUBLE_EQ(events[1].wall_time(), 1700000001.5);
  ASSERT_EQ(events[1].summary().value_size(), 2);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_FLOAT_EQ(events[1].summary().value(0).simple_value(), 0.4321f);
  EXPECT_EQ(events[1].summary().value(1).tag(), "train/lr");
  EXPECT_FLOAT_EQ(events[1].summary().value(1).simple_value(), 0.001f);
  EXPECT_EQ(events[2].step(), 400);
  ASSERT_EQ(events[2].summary().value_size(), 1);
  EXPECT_FLOAT_EQ(events[2].summary().value(0).simple_value(), 0.25f);

  // The library's reader agrees.
  auto records = ReadTfRecords(Slurp(path));
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 3u);

  EXPECT_EQ((*writer)->WriteScalars(1, {{"x", 1}}).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Field numbers as TensorFlow's event.proto / summary.proto: wall_time 1
// (fixed64), step 2 (varint), file_version 3, summary 5; Summary.value 1;
// Value.tag 1, simple_value 2 (fixed32).
TEST(TensorBoardTest, WireFormatHasTensorFlowsFieldNumbers) {
  tb::Event event;
  event.set_step(7);
  tb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag("a");
  v->set_simple_value(1.0f);
  const std::string expected = std::string(
      "\x10\x07"  // step = 7
      "\x2a\x0a"  // summary, 10 bytes
      "\x0a\x08"  // value, 8 bytes
      "\x0a\x01"
      "a"                      // tag = "a"
      "\x15\x00\x00\x80\x3f",  // simple_value = 1.0f
      14);
  EXPECT_EQ(event.SerializeAsString(), expected);
  tb::Event version;
  version.set_wall_time(1.0);
  version.set_file_version("v");
  EXPECT_EQ(version.SerializeAsString(),
            std::string("\x09\x00\x00\x00\x00\x00\x00\xf0\x3f\x1a\x01v", 12));
}

TEST(TensorBoardTest, RecordFraming) {
  const std::string record = EncodeTfRecord("abc");
  ASSERT_EQ(record.size(), 3u + 16u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(Le(record, 8, 4), Mask(Crc32c(record.substr(0, 8))));
  EXPECT_EQ(record.substr(12, 3), "abc");
  // CRC-32C("abc") = 0x364b3fb7.
  EXPECT_EQ(Le(record, 15, 4), Mask(0x364b3fb7u));
  auto records = ReadTfRecords(record + EncodeTfRecord(""));
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(*records, (std::vector<std::string>{"abc", ""}));
}

TEST(TensorBoardTest, CorruptedByteIsDetected) {
  const std::string dir = TestDir("corrupt");
  std::string path;
  {
    auto writer = TensorBoardWriter::Create(dir);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->WriteScalars(1, {{"train/loss", 2.5f}}).ok());
    path = (*writer)->path();
  }
  const std::string good = Slurp(path);
  std::vector<tb::Event> events;
  std::string error;
  ASSERT_TRUE(ReadEvents(good, &events, &error)) << error;
  // Every byte of the file, flipped, is caught by one of the two CRCs
  // (or makes the length run past the end).
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    events.clear();
    EXPECT_FALSE(ReadEvents(bad, &events, &error)) << "byte " << i;
    const auto records = ReadTfRecords(bad);
    EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
  const auto truncated = ReadTfRecords(good.substr(0, good.size() - 1));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
}

TEST(TensorBoardTest, SecondWriterInTheSameSecondGetsItsOwnFile) {
  const std::string dir = TestDir("twice");
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  auto a = TensorBoardWriter::Create(dir, now);
  auto b = TensorBoardWriter::Create(dir, now);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  EXPECT_EQ((*b)->path(), (*a)->path() + ".1");
}

TEST(TensorBoardTest, UncreatableFolderIsAnError) {
  const std::string dir = TestDir("file");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/plain") << "x";
  auto writer = TensorBoardWriter::Create(dir + "/plain/tb");
  EXPECT_FALSE(writer.ok());
  EXPECT_TRUE(absl::StrContains(writer.status().message(), dir + "/plain/tb"))
      << writer.status();
}

}  // namespace
}  // namespace pstrain
