#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace pstrain {
namespace safetensors {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this code copies them "
              "as they are");

using Json = nlohmann::ordered_json;

constexpr size_t kLengthBytes = 8;  // the header length field
// Nesting of a valid header: object -> tensor entry -> shape array.
constexpr int kMaxJsonDepth = 3;
// write() and crc32 are fed at most this many bytes at a time.
constexpr size_t kIoChunkBytes = size_t{1} << 30;

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  int size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBool, "BOOL", 1},      {Dtype::kU8, "U8", 1},
    {Dtype::kI8, "I8", 1},          {Dtype::kF8E5M2, "F8_E5M2", 1},
    {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kI16, "I16", 2},
    {Dtype::kU16, "U16", 2},        {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},      {Dtype::kI32, "I32", 4},
    {Dtype::kU32, "U32", 4},        {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},        {Dtype::kI64, "I64", 8},
    {Dtype::kU64, "U64", 8},
};

const DtypeInfo& Info(Dtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  return kDtypes[0];  // unreachable for a valid enum value
}

// Escapes control bytes, so that text from a file (a tensor name, a JSON
// parser's message) cannot break an error message's single line.
std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string Quote(absl::string_view name) {
  return absl::StrCat("'", Printable(name), "'");
}

// "<path>: <problem>", on one line.
std::string Message(absl::string_view path, absl::string_view problem) {
  return Printable(absl::StrCat(path, ": ", problem));
}

absl::Status DataLoss(absl::string_view path, absl::string_view problem) {
  return absl::DataLossError(Message(path, problem));
}

absl::Status InvalidArgument(absl::string_view path,
                             absl::string_view problem) {
  return absl::InvalidArgumentError(Message(path, problem));
}

absl::Status Errno(int error_number, absl::string_view path,
                   absl::string_view what) {
  return ErrnoToStatus(error_number, Message(path, what));
}

// Element count of `shape`, or nullopt if a dimension is negative or the
// product overflows int64.
std::optional<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (const int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(n, dim, &n)) return std::nullopt;
  }
  return n;
}

// Byte count of `num_elements` of `dtype`, or nullopt on overflow.
std::optional<int64_t> NumBytes(int64_t num_elements, Dtype dtype) {
  int64_t bytes = 0;
  if (__builtin_mul_overflow(num_elements, int64_t{DtypeSize(dtype)}, &bytes))
    return std::nullopt;
  return bytes;
}

// ---------------------------------------------------------------- writing

// JSON string literal of `text`; nullopt if it is not valid UTF-8.
std::optional<std::string> JsonString(const std::string& text) {
  try {
    return Json(text).dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::type_error&) {
    return std::nullopt;
  }
}

uint32_t Crc32Update(uint32_t crc, const char* data, size_t size) {
  while (size > 0) {
    const size_t n = std::min(size, kIoChunkBytes);
    crc = static_cast<uint32_t>(
        crc32_z(crc, reinterpret_cast<const Bytef*>(data), n));
    data += n;
    size -= n;
  }
  return crc;
}

// A file descriptor closed on destruction (errors of that close ignored:
// the paths that care call Close()).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close(2)'s result; errno is set on failure.
  int Close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

 private:
  int fd_;
};

// Writes all of `data` to `fd`, folding it into `*crc`; errno on failure.
bool WriteAll(int fd, absl::string_view data, uint32_t* crc) {
  *crc = Crc32Update(*crc, data.data(), data.size());
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min(left, kIoChunkBytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

std::string Folder(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Creates a new file `path`.tmp.<random> (O_EXCL|O_NOFOLLOW: never an
// existing file or a link's target) with mode 0666 less the umask, as any
// data file; its name in `*tmp`. The descriptor, or -1 with errno set.
int CreateTemporary(const std::string& path, std::string* tmp) {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    *tmp = absl::StrFormat("%s.tmp.%d.%x%08x", path, ::getpid(),
                           counter.fetch_add(1), random());
    const int fd =
        ::open(tmp->c_str(),
               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

// Builds the header JSON (padded with spaces to a multiple of 8 bytes), after
// checking every tensor and metadata entry.
absl::StatusOr<std::string> BuildHeader(
    const std::string& path, absl::Span<const TensorView> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      const std::optional<std::string> json_key = JsonString(key);
      const std::optional<std::string> json_value = JsonString(value);
      if (!json_key || !json_value) {
        return InvalidArgument(
            path, absl::StrCat("metadata ", Quote(key), " is not valid UTF-8"));
      }
      absl::StrAppend(&header, first ? "" : ",", *json_key, ":", *json_value);
      first = false;
    }
    header += "}";
  }
  absl::flat_hash_set<absl::string_view> names;
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    const std::string what = absl::StrCat("tensor ", Quote(t.name));
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgument(
          path, absl::StrCat("tensor ", i, ": name ", Quote(t.name),
                             " is reserved or empty"));
    }
    if (!names.insert(t.name).second) {
      return InvalidArgument(path, absl::StrCat(what, " is given twice"));
    }
    const std::optional<std::string> json_name = JsonString(t.name);
    if (!json_name) {
      return InvalidArgument(path, absl::StrCat(what, ": not valid UTF-8"));
    }
    const std::optional<int64_t> num_elements = NumElements(t.shape);
    const std::optional<int64_t> num_bytes =
        num_elements ? NumBytes(*num_elements, t.dtype) : std::nullopt;
    if (!num_bytes) {
      return InvalidArgument(
          path, absl::StrCat(what, ": shape ", ShapeString(t.shape),
                             " has a negative dimension or overflows"));
    }
    if (static_cast<uint64_t>(*num_bytes) != t.bytes.size()) {
      return InvalidArgument(
          path, absl::StrCat(what, ": ", t.bytes.size(), " bytes given; shape ",
                             ShapeString(t.shape), " of ", DtypeName(t.dtype),
                             " needs ", *num_bytes));
    }
    absl::StrAppend(&header, header.size() > 1 ? "," : "", *json_name,
                    ":{\"dtype\":\"", DtypeName(t.dtype), "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset,
                    ",", offset + *num_bytes, "]}");
    offset += *num_bytes;
  }
  header += "}";
  header.resize(
      (header.size() + kLengthBytes - 1) / kLengthBytes * kLengthBytes, ' ');
  if (header.size() > kMaxHeaderBytes) {
    return InvalidArgument(
        path, absl::StrCat("header of ", header.size(),
                           " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  return header;
}

// ---------------------------------------------------------------- reading

// Thrown by the parser callback to stop parsing a header nested too deep.
struct TooDeep {};

// Parses `text`, noting the first duplicate key of any object in
// `*duplicate` (nlohmann keeps one of them silently).
absl::StatusOr<Json> ParseHeader(const std::string& path,
                                 absl::string_view text,
                                 std::optional<std::string>* duplicate) {
  std::vector<absl::flat_hash_set<std::string>> keys;  // one per open object
  int depth = 0;
  const Json::parser_callback_t callback = [&](int, Json::parse_event_t event,
                                               Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        [[fallthrough]];
      case Json::parse_event_t::array_start:
        if (++depth > kMaxJsonDepth) throw TooDeep();
        break;
      case Json::parse_event_t::object_end:
        keys.pop_back();
        [[fallthrough]];
      case Json::parse_event_t::array_end:
        --depth;
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second && !duplicate->has_value()) {
          *duplicate = key;
        }
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const TooDeep&) {
    return DataLoss(path, absl::StrCat("header nests deeper than ",
                                       kMaxJsonDepth, " levels"));
  } catch (const Json::exception& e) {
    // Drops the "[json.exception.parse_error.101] " prefix.
    absl::string_view what = e.what();
    const size_t prefix = what.find("] ");
    if (!what.empty() && what[0] == '[' && prefix != what.npos) {
      what.remove_prefix(prefix + 2);
    }
    return DataLoss(path, absl::StrCat("header is not valid JSON: ", what));
  }
}

// A JSON value that must be a non-negative integer of at most `max`.
bool GetCount(const Json& value, uint64_t max, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return *out <= max;
}

// A JSON value as text for an error message, cut to 64 bytes.
std::string Dump(const Json& value) {
  constexpr size_t kMaxBytes = 64;
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxBytes)
    text = absl::StrCat(text.substr(0, kMaxBytes), "...");
  return text;
}

struct Entry {
  Tensor tensor;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Checks one tensor entry of the header against a buffer of `data_size`
// bytes.
absl::StatusOr<Entry> ParseEntry(const std::string& path,
                                 const std::string& name, const Json& value,
                                 uint64_t data_size) {
  const std::string what = absl::StrCat("tensor ", Quote(name));
  auto bad = [&](absl::string_view problem) {
    return DataLoss(path, absl::StrCat(what, ": ", problem));
  };
  if (!value.is_object()) return bad("entry is not a JSON object");
  for (const auto& [key, field] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad(absl::StrCat("unknown field ", Quote(key)));
    }
  }
  Entry entry;
  entry.tensor.name = name;

  const auto dtype = value.find("dtype");
  if (dtype == value.end()) return bad("no \"dtype\"");
  if (!dtype->is_string()) {
    return bad(absl::StrCat("\"dtype\" is not a string: ", Dump(*dtype)));
  }
  const std::optional<Dtype> parsed_dtype =
      ParseDtype(dtype->get_ref<const std::string&>());
  if (!parsed_dtype) {
    return bad(absl::StrCat("unknown or unsupported dtype ", Dump(*dtype)));
  }
  entry.tensor.dtype = *parsed_dtype;

  const auto shape = value.find("shape");
  if (shape == value.end()) return bad("no \"shape\"");
  if (!shape->is_array()) {
    return bad(absl::StrCat("\"shape\" is not an array: ", Dump(*shape)));
  }
  for (const Json& dim : *shape) {
    uint64_t d = 0;
    if (!GetCount(dim, std::numeric_limits<int64_t>::max(), &d)) {
      return bad(absl::StrCat("shape ", Dump(*shape),
                              " has a dimension that is not an integer in [0, "
                              "2^63)"));
    }
    entry.tensor.shape.push_back(static_cast<int64_t>(d));
  }
  const std::optional<int64_t> num_elements = NumElements(entry.tensor.shape);
  const std::optional<int64_t> num_bytes =
      num_elements ? NumBytes(*num_elements, entry.tensor.dtype) : std::nullopt;
  if (!num_bytes) {
    return bad(absl::StrCat("shape ", ShapeString(entry.tensor.shape), " of ",
                            DtypeName(entry.tensor.dtype),
                            " overflows a 64-bit byte count"));
  }
  entry.tensor.num_elements = *num_elements;

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end()) return bad("no \"data_offsets\"");
  if (!offsets->is_array() || offsets->size() != 2 ||
      !GetCount((*offsets)[0], std::numeric_limits<uint64_t>::max(),
                &entry.begin) ||
      !GetCount((*offsets)[1], std::numeric_limits<uint64_t>::max(),
                &entry.end)) {
    return bad(absl::StrCat(
        "\"data_offsets\" is not a pair of non-negative integers: ",
        Dump(*offsets)));
  }
  const std::string offsets_text =
      absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
  if (entry.begin > entry.end) {
    return bad(absl::StrCat(offsets_text, " begin after they end"));
  }
  if (entry.end > data_size) {
    return bad(absl::StrCat(offsets_text, " run past the end of the ",
                            data_size, "-byte data buffer"));
  }
  if (entry.end - entry.begin != static_cast<uint64_t>(*num_bytes)) {
    return bad(absl::StrCat(offsets_text, " hold ", entry.end - entry.begin,
                            " bytes; shape ", ShapeString(entry.tensor.shape),
                            " of ", DtypeName(entry.tensor.dtype), " needs ",
                            *num_bytes));
  }
  return entry;
}

}  // namespace

absl::string_view DtypeName(Dtype dtype) { return Info(dtype).name; }

int DtypeSize(Dtype dtype) { return Info(dtype).size; }

std::optional<Dtype> ParseDtype(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

TensorView F32View(std::string name, std::vector<int64_t> shape,
                   absl::Span<const float> values) {
  return TensorView{
      std::move(name), Dtype::kF32, std::move(shape),
      absl::string_view(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(float))};
}

TensorView I64View(std::string name, std::vector<int64_t> shape,
                   absl::Span<const int64_t> values) {
  return TensorView{
      std::move(name), Dtype::kI64, std::move(shape),
      absl::string_view(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(int64_t))};
}

absl::StatusOr<WriteResult> Write(
    const std::string& path, absl::Span<const TensorView> tensors,
    const std::map<std::string, std::string>& metadata,
    const WriteOptions& options) {
  ASSIGN_OR_RETURN(const std::string header,
                   BuildHeader(path, tensors, metadata));

  const std::string folder = Folder(path);
  std::string tmp;
  Fd fd(CreateTemporary(path, &tmp));
  if (fd.get() < 0) {
    return Errno(errno, path,
                 absl::StrCat("cannot create a temporary file in folder '",
                              folder, "'"));
  }
  auto fail = [&](absl::string_view what) {
    const absl::Status status = Errno(errno, path, what);
    ::unlink(tmp.c_str());
    return status;
  };

  WriteResult result;
  char length[kLengthBytes];
  uint64_t n = header.size();
  for (size_t i = 0; i < kLengthBytes; ++i, n >>= 8) {
    length[i] = static_cast<char>(n & 0xff);
  }
  if (!WriteAll(fd.get(), absl::string_view(length, kLengthBytes),
                &result.crc32) ||
      !WriteAll(fd.get(), header, &result.crc32)) {
    return fail("write");
  }
  result.size_bytes = kLengthBytes + header.size();
  for (const TensorView& t : tensors) {
    if (!WriteAll(fd.get(), t.bytes, &result.crc32)) return fail("write");
    result.size_bytes += t.bytes.size();
  }
  if (::fsync(fd.get()) != 0) return fail("fsync");
  if (fd.Close() != 0) return fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename");
  if (!options.sync_folder) return result;

  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0 || ::fsync(dir.get()) != 0) {
    return Errno(errno, path, absl::StrCat("fsync of folder '", folder, "'"));
  }
  return result;
}

absl::StatusOr<File> File::Read(const std::string& path,
                                const ReadOptions& options) {
  ASSIGN_OR_RETURN(const RegularFile in,
                   OpenRegularFile(path, options.follow_symlinks));
  File file;
  file.path_ = path;
  const uint64_t size = in.size_bytes();
  if (options.size_bytes && *options.size_bytes != size) {
    return DataLoss(path, absl::StrCat("file is ", size, " bytes, expected ",
                                       *options.size_bytes));
  }
  if (size > options.max_size_bytes) {
    return DataLoss(path,
                    absl::StrCat("file is ", size, " bytes, more than the ",
                                 options.max_size_bytes, " this reader takes"));
  }
  // The header, read and checked before the data buffer is allocated: the
  // buffer's size is then the one the header's tensors cover exactly.
  if (size < kLengthBytes) {
    return DataLoss(path, absl::StrCat("file is ", size,
                                       " bytes, shorter than the 8-byte "
                                       "header length"));
  }
  char length[kLengthBytes];
  RETURN_IF_ERROR(in.ReadAt(path, 0, length, kLengthBytes));
  uint64_t header_size = 0;
  for (size_t i = kLengthBytes; i-- > 0;) {
    header_size = (header_size << 8) | static_cast<unsigned char>(length[i]);
  }
  if (header_size > kMaxHeaderBytes) {
    return DataLoss(
        path, absl::StrCat("header length ", header_size,
                           " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_size > size - kLengthBytes) {
    return DataLoss(path, absl::StrCat("header length ", header_size,
                                       " bytes runs past the end of the ", size,
                                       "-byte file"));
  }
  std::string header_bytes(static_cast<size_t>(header_size), '\0');
  RETURN_IF_ERROR(
      in.ReadAt(path, kLengthBytes, header_bytes.data(), header_size));
  const absl::string_view header_text(header_bytes);
  if (header_text.empty() || header_text[0] != '{') {
    return DataLoss(path, "header does not begin with '{'");
  }
  // JSON text has no NUL byte, and nlohmann's parser would take one for the
  // end of its input (accepting "{}\0anything").
  if (const size_t nul = header_text.find('\0'); nul != header_text.npos) {
    return DataLoss(path,
                    absl::StrCat("header has a NUL byte at offset ", nul));
  }
  std::optional<std::string> duplicate;
  ASSIGN_OR_RETURN(const Json header,
                   ParseHeader(path, header_text, &duplicate));
  if (duplicate) {
    return DataLoss(
        path, absl::StrCat("header has the key ", Quote(*duplicate), " twice"));
  }
  if (!header.is_object()) return DataLoss(path, "header is not an object");

  // The entries.
  const uint64_t data_size = size - kLengthBytes - header_size;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return DataLoss(path, "__metadata__ is not a JSON object");
      }
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return DataLoss(path, absl::StrCat("__metadata__ ", Quote(key),
                                             " is not a string: ", Dump(text)));
        }
        file.metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(Entry entry, ParseEntry(path, name, value, data_size));
    entries.push_back(std::move(entry));
  }

  // The buffer: covered exactly, in order of offsets (ties, which only
  // empty tensors can make, in header order).
  std::stable_sort(
      entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
      });
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (Entry& entry : entries) {
    if (entry.begin > cursor) {
      return DataLoss(
          path,
          absl::StrCat("bytes [", cursor, ", ", entry.begin,
                       ") of the data buffer belong to no tensor (before ",
                       Quote(entry.tensor.name), ")"));
    }
    if (entry.begin < cursor) {
      return DataLoss(
          path, absl::StrCat("tensor ", Quote(entry.tensor.name),
                             ": data_offsets [", entry.begin, ", ", entry.end,
                             "] overlap tensor ", Quote(*previous)));
    }
    cursor = entry.end;
    previous = &entry.tensor.name;
  }
  if (cursor != data_size) {
    return DataLoss(path, absl::StrCat("bytes [", cursor, ", ", data_size,
                                       ") of the data buffer belong to no "
                                       "tensor (trailing bytes)"));
  }

  // The whole file, now that its size is the header's.
  file.contents_.reset(new (std::nothrow) char[std::max<uint64_t>(size, 1)]);
  if (file.contents_ == nullptr) {
    return absl::ResourceExhaustedError(Message(
        path,
        absl::StrCat("cannot allocate ", size, " bytes to read the file")));
  }
  char* const contents = file.contents_.get();
  std::memcpy(contents, length, kLengthBytes);
  std::memcpy(contents + kLengthBytes, header_bytes.data(), header_size);
  const uint64_t data_begin = kLengthBytes + header_size;
  RETURN_IF_ERROR(
      in.ReadAt(path, data_begin, contents + data_begin, data_size));
  file.size_bytes_ = size;
  file.crc32_ = Crc32Update(static_cast<uint32_t>(crc32_z(0, nullptr, 0)),
                            contents, size);
  if (options.crc32 && *options.crc32 != file.crc32_) {
    return DataLoss(path, absl::StrFormat("crc32 is %08x, expected %08x",
                                          file.crc32_, *options.crc32));
  }
  for (Entry& entry : entries) {
    entry.tensor.bytes = absl::string_view(contents + data_begin + entry.begin,
                                           entry.end - entry.begin);
  }

  file.tensors_.reserve(entries.size());
  for (Entry& entry : entries) {
    file.index_[entry.tensor.name] = file.tensors_.size();
    file.tensors_.push_back(std::move(entry.tensor));
  }
  return file;
}

const Tensor* File::Find(absl::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const Tensor*> File::Get(absl::string_view name, Dtype dtype,
                                        absl::Span<const int64_t> shape) const {
  const Tensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(Message(
        path_, absl::StrCat("no tensor ", Quote(name), " (the file has ",
                            tensors_.size(), " tensors)")));
  }
  if (tensor->dtype != dtype) {
    return InvalidArgument(
        path_,
        absl::StrCat("tensor ", Quote(name), " is ", DtypeName(tensor->dtype),
                     ", expected ", DtypeName(dtype)));
  }
  if (absl::Span<const int64_t>(tensor->shape) != shape) {
    return InvalidArgument(
        path_, absl::StrCat("tensor ", Quote(name), " has shape ",
                            ShapeString(tensor->shape), ", expected ",
                            ShapeString(shape)));
  }
  return tensor;
}

absl::StatusOr<std::vector<float>> File::ReadFloats(
    absl::string_view name, absl::Span<const int64_t> shape) const {
  ASSIGN_OR_RETURN(const Tensor* tensor, Get(name, Dtype::kF32, shape));
  std::vector<float> values(static_cast<size_t>(tensor->num_elements));
  if (!values.empty()) {
    std::memcpy(values.data(), tensor->bytes.data(), tensor->bytes.size());
  }
  return values;
}

}  // namespace safetensors
}  // namespace pstrain
