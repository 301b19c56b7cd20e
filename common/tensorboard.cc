#include "common/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "proto/tensorboard_event.pb.h"

namespace pstrain {
namespace {

// Little-endian, whatever the host.
void AppendFixed64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void AppendFixed32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t DecodeFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t DecodeFixed32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  return name;
}

// Opens a file that did not exist (O_EXCL): `base`, else `base`.1, .2, ...
absl::StatusOr<std::pair<std::string, std::FILE*>> OpenNewFile(
    const std::string& base) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const std::string path =
        attempt == 0 ? base : absl::StrCat(base, ".", attempt);
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return ErrnoToStatus(errno, path);
    }
    std::FILE* file = fdopen(fd, "wb");
    if (file == nullptr) {
      const int error = errno;
      close(fd);
      return ErrnoToStatus(error, path);
    }
    return std::make_pair(path, file);
  }
  return absl::AlreadyExistsError(
      absl::StrCat(base, ": 1000 event files of that name exist already"));
}

}  // namespace

std::string EncodeTfRecord(absl::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  AppendFixed64(data.size(), &record);
  AppendFixed32(MaskCrc32c(Crc32c(record)), &record);
  record.append(data.data(), data.size());
  AppendFixed32(MaskCrc32c(Crc32c(data)), &record);
  return record;
}

absl::StatusOr<std::vector<std::string>> ReadTfRecords(
    absl::string_view contents) {
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset < contents.size()) {
    auto loss = [&](absl::string_view what) {
      return absl::DataLossError(absl::StrCat("TFRecord ", records.size(),
                                              " at byte ", offset, ": ", what));
    };
    if (contents.size() - offset < 12) return loss("truncated length");
    const char* header = contents.data() + offset;
    if (UnmaskCrc32c(DecodeFixed32(header + 8)) !=
        Crc32c(absl::string_view(header, 8))) {
      return loss("length CRC mismatch");
    }
    const uint64_t length = DecodeFixed64(header);
    if (contents.size() - offset - 12 < 4 ||
        length > contents.size() - offset - 16) {
      return loss(absl::StrCat("truncated data of ", length, " bytes"));
    }
    const absl::string_view data = contents.substr(offset + 12, length);
    if (UnmaskCrc32c(DecodeFixed32(data.data() + length)) != Crc32c(data)) {
      return loss("data CRC mismatch");
    }
    records.emplace_back(data);
    offset += 16 + length;
  }
  return records;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir, absl::Time now) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return ErrnoToStatus(error.value(), absl::StrCat(dir, ": cannot create"));
  }
  const std::string base =
      absl::StrFormat("%s/events.out.tfevents.%010d.%s", dir,
                      absl::ToUnixSeconds(now), HostName());
  ASSIGN_OR_RETURN(auto opened, OpenNewFile(base));
  std::unique_ptr<TensorBoardWriter> writer(
      new TensorBoardWriter(std::move(opened.first), opened.second));
  tb::Event event;
  event.set_wall_time(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  event.set_file_version(kTensorBoardFileVersion);
  RETURN_IF_ERROR(writer->WriteRecord(event.SerializeAsString()));
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { Close().IgnoreError(); }

absl::Status TensorBoardWriter::WriteScalars(
    int64_t step, absl::Span<const TensorBoardScalar> scalars,
    absl::Time wall_time) {
  if (scalars.empty()) return error_;
  tb::Event event;
  event.set_wall_time(absl::ToDoubleSeconds(wall_time - absl::UnixEpoch()));
  event.set_step(step);
  tb::Summary* summary = event.mutable_summary();
  for (const TensorBoardScalar& s : scalars) {
    tb::Summary::Value* value = summary->add_value();
    value->set_tag(s.tag);
    value->set_simple_value(s.value);
  }
  return WriteRecord(event.SerializeAsString());
}

absl::Status TensorBoardWriter::WriteRecord(absl::string_view data) {
  if (!error_.ok()) return error_;
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": written after Close"));
  }
  const std::string record = EncodeTfRecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    error_ = ErrnoToStatus(errno, absl::StrCat(path_, ": write"));
  }
  return error_;
}

absl::Status TensorBoardWriter::Close() {
  if (file_ == nullptr) return error_;
  std::FILE* file = file_;
  file_ = nullptr;
  if (std::fclose(file) != 0 && error_.ok()) {
    error_ = ErrnoToStatus(errno, absl::StrCat(path_, ": close"));
  }
  return error_;
}

}  // namespace pstrain
