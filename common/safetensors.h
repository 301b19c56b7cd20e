// Reading and writing tensors in the safetensors file format, the format of
// checkpoint shard files and of the model file that PyTorch loads.
//
// Format (https://github.com/huggingface/safetensors, README "Format", and
// its reference implementation safetensors/src/tensor.rs):
//   - 8 bytes: N, the header's length in bytes, a little-endian uint64;
//   - N bytes: the header, UTF-8 JSON beginning with '{' and possibly padded
//     at the end with spaces: an object mapping each tensor's name to
//     {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, plus
//     an optional "__metadata__" object of string -> string;
//   - the byte buffer: every tensor's elements, little-endian, row-major (C
//     order); data_offsets are byte offsets into this buffer (not into the
//     file), `end` exclusive. The tensors must cover the buffer exactly: no
//     hole, no overlap, nothing after the last tensor.
//
// Write() lays out the file as the reference implementation does (compact
// JSON, "__metadata__" first, keys "dtype", "shape", "data_offsets", header
// padded with spaces to a multiple of 8 bytes) but keeps the caller's tensor
// order; given tensors in the reference's order (descending dtype alignment,
// then name) its output is byte-identical to the reference's.
//
// Durability: Write() writes to a temporary file in the target's folder,
// fsyncs it, renames it over `path` and fsyncs the folder, so after an OK
// return the file survives a crash, and at no time does `path` hold a partial
// file. On error the temporary file is removed and `path` keeps its old
// contents (or, if only the folder's fsync failed, has the new file). The
// temporary file is created with O_EXCL|O_NOFOLLOW and mode 0666 less the
// process's umask, so the file follows the umask as any data file does. With
// WriteOptions::sync_folder false the folder's fsync is the caller's (a
// checkpoint writes several files into one folder and fsyncs it once): the
// file's contents are durable on return, its name only after that fsync.
//
// Reading treats the file as hostile (common/regular_file.h): it is opened
// with O_NONBLOCK (a FIFO does not hang) and, unless
// ReadOptions::follow_symlinks, O_NOFOLLOW; anything but a regular file is
// refused; the 8-byte length and the header (at most kMaxHeaderBytes) are
// read and every entry checked against the file's size before the data
// buffer is allocated, so a file whose size the header does not account for
// exactly (a sparse 8 TB file, say) is refused without allocating it; a
// file over ReadOptions::max_size_bytes is refused before anything is read.
//
// Errors are absl::Status values whose message is one line that begins with
// the file's path and names the problem (a tensor's name is quoted with
// C-style escapes):
//   - NOT_FOUND: the file (or, for Write, the folder) does not exist; a
//     tensor asked for by name is not in the file;
//   - RESOURCE_EXHAUSTED: the file's buffer cannot be allocated;
//   - DATA_LOSS: the file is not a valid safetensors file (too short, header
//     length out of range, bad JSON, bad or duplicate entries, bad dtype,
//     shape or offsets, a buffer not covered exactly), or its size or crc32
//     differs from the expected ones in ReadOptions, or it is larger than
//     ReadOptions::max_size_bytes;
//   - INVALID_ARGUMENT: the path is a symbolic link (not followed), a FIFO,
//     a device or a folder; the caller asked for something wrong (a tensor to
//     write whose byte count does not match its shape, a duplicate name, a
//     tensor read with another dtype or shape than it has);
//   - other codes for operating-system errors (PERMISSION_DENIED, INTERNAL).
//
// Sizes are in bytes; shapes and element counts are in elements. Supported
// dtypes: the byte-sized ones of the reference (sub-byte F4/F6 are refused).
//
// Thread-safety: Write() and File::Read() may be called from any thread
// (distinct paths). A File is immutable after Read(); its const methods may
// be called from any thread without synchronization.
#ifndef PSTRAIN_COMMON_SAFETENSORS_H_
#define PSTRAIN_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pstrain {
namespace safetensors {

enum class Dtype {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// The name in the file ("F32"), and bytes per element.
absl::string_view DtypeName(Dtype dtype);
int DtypeSize(Dtype dtype);
// "F32" -> kF32; nullopt for a name this code does not support.
std::optional<Dtype> ParseDtype(absl::string_view name);

// Largest header Read() accepts, as the reference (100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor to write. `bytes` is not owned and must stay valid during
// Write(); it holds the elements little-endian, row-major, and its size must
// be the product of `shape` (1 for shape []) times DtypeSize(dtype).
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  absl::string_view bytes;
};

// Builds a TensorView over `values` (not copied).
TensorView F32View(std::string name, std::vector<int64_t> shape,
                   absl::Span<const float> values);
TensorView I64View(std::string name, std::vector<int64_t> shape,
                   absl::Span<const int64_t> values);

struct WriteResult {
  // The whole file's size in bytes and its zlib crc32, for a manifest.
  uint64_t size_bytes = 0;
  uint32_t crc32 = 0;
};

struct WriteOptions {
  // fsync the folder after the rename (see "Durability" above).
  bool sync_folder = true;
};

// Writes `tensors` (in this order in the buffer) and `metadata` durably to
// `path` (see above). Names must be unique, non-empty, valid UTF-8 and not
// "__metadata__"; metadata keys and values valid UTF-8 (INVALID_ARGUMENT
// otherwise). An empty `metadata` writes no "__metadata__" entry.
absl::StatusOr<WriteResult> Write(
    const std::string& path, absl::Span<const TensorView> tensors,
    const std::map<std::string, std::string>& metadata = {},
    const WriteOptions& options = {});

// Largest file Read() takes by default: 64 GiB (the largest pstrain writes,
// a ResNet-152 shard with Adam's m and v, is under 1 GiB).
constexpr uint64_t kMaxFileBytes = uint64_t{64} << 30;

struct ReadOptions {
  // What a manifest says the file must be; DATA_LOSS if it is not.
  std::optional<uint64_t> size_bytes;
  std::optional<uint32_t> crc32;
  // Refused (DATA_LOSS) before anything is read or allocated when larger.
  uint64_t max_size_bytes = kMaxFileBytes;
  // Follow a symbolic link at `path` itself: for a file a user named on a
  // command line; never for the files inside a checkpoint, which pstrain
  // writes as plain files.
  bool follow_symlinks = false;
};

// One tensor of a File. `bytes` points into the File that owns it.
struct Tensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  absl::string_view bytes;
};

// A whole safetensors file read into memory and validated. Move-only.
class File {
 public:
  // Reads and validates all of `path` (see the errors above) before it
  // returns; the file's crc32 is computed on every read.
  static absl::StatusOr<File> Read(const std::string& path,
                                   const ReadOptions& options = {});

  File(File&&) = default;
  File& operator=(File&&) = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size_bytes() const { return size_bytes_; }
  uint32_t crc32() const { return crc32_; }
  // In file order (increasing data offset).
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // The tensor `name`, or nullptr.
  const Tensor* Find(absl::string_view name) const;

  // The tensor `name`, checked to have `dtype` and `shape`: NOT_FOUND if
  // absent, INVALID_ARGUMENT naming the tensor, what it has and what was
  // expected otherwise.
  absl::StatusOr<const Tensor*> Get(absl::string_view name, Dtype dtype,
                                    absl::Span<const int64_t> shape) const;

  // Get(name, kF32, shape), its elements copied out as floats.
  absl::StatusOr<std::vector<float>> ReadFloats(
      absl::string_view name, absl::Span<const int64_t> shape) const;

 private:
  File() = default;

  std::string path_;
  uint64_t size_bytes_ = 0;
  uint32_t crc32_ = 0;
  // The whole file; Tensor::bytes point into it (stable across moves).
  std::unique_ptr<char[]> contents_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> tensors_ index
  std::map<std::string, std::string> metadata_;
};

// "[6,1,5,5]", as error messages print shapes.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace safetensors
}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SAFETENSORS_H_
