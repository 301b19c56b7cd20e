// A read-only memory mapping of a whole file, for datasets larger than
// memory: the training loop reads samples straight from the mapping, and the
// kernel pages them in from the page cache (or the disk) on first touch.
//
// Resident memory: mapped pages a process has touched count in its resident
// set (RssFile) until they are unmapped or reclaimed, so a pass over a 3 GB
// file would show as 3 GB of RSS although the page cache, not the process,
// holds them. NoteRead() therefore releases the mapping's pages from this
// process (madvise MADV_DONTNEED) after every `release_every_bytes` read
// through it: RSS stays below that bound plus what one batch touches, and
// later reads fault the pages back in from the page cache (or the file);
// the data is never changed, since the mapping is read-only.
//
// Thread-safety: all methods are const and may be called from any number of
// threads at once; the mapping lives until the object is destroyed, which
// must not race with reads.
#ifndef PSTRAIN_WORKER_MAPPED_FILE_H_
#define PSTRAIN_WORKER_MAPPED_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace pstrain {

class MappedFile {
 public:
  // Resident bytes after which NoteRead releases the mapping's pages.
  static constexpr uint64_t kDefaultReleaseEveryBytes = uint64_t{64} << 20;

  // Maps `path` read-only (PROT_READ, MAP_SHARED) and advises random access
  // (MADV_RANDOM: no read-ahead, samples are read in shuffled order).
  // NOT_FOUND if it cannot be opened for that reason, INVALID_ARGUMENT for
  // what is not a regular file (a FIFO, a device, a folder: refused without
  // waiting; symbolic links are followed), otherwise the errno of
  // open/fstat/mmap as a status naming the file. An empty file maps to
  // data() == nullptr and size() == 0.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path,
      uint64_t release_every_bytes = kDefaultReleaseEveryBytes);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Counts `bytes` read sequentially through the mapping; when the count
  // passes release_every_bytes, calls ReleaseResident() and starts again.
  void NoteRead(uint64_t bytes) const;
  // As NoteRead for one read of `bytes` at a random place: counts what the
  // kernel maps for it, the pages it spans plus its fault-around
  // (/sys/kernel/mm/transparent_hugepage aside, Linux maps up to 16 pages,
  // 64 KiB, of page cache around a faulting address, whatever the madvise
  // advice), so that random reads are released as often as they grow RSS.
  void NoteRandomRead(uint64_t bytes) const;
  static constexpr uint64_t kFaultAroundBytes = 64 << 10;
  // madvise(MADV_DONTNEED) over the whole mapping.
  void ReleaseResident() const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size,
             uint64_t release_every_bytes)
      : path_(std::move(path)),
        data_(data),
        size_(size),
        release_every_bytes_(release_every_bytes) {}

  const std::string path_;
  const uint8_t* const data_;
  const size_t size_;
  const uint64_t release_every_bytes_;
  mutable std::atomic<uint64_t> read_since_release_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MAPPED_FILE_H_
