#include "worker/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/memory/memory.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path, uint64_t release_every_bytes) {
  // Never blocks: a FIFO or a device in the file's place is refused.
  ASSIGN_OR_RETURN(RegularFile file,
                   OpenRegularFile(path, /*follow_symlinks=*/true));
  const size_t size = static_cast<size_t>(file.size_bytes());
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (data == MAP_FAILED) return ErrnoToStatus(errno, path);
    // Advice only: a refusal changes speed, not results.
    (void)::madvise(data, size, MADV_RANDOM);
  }
  // Closing the file (`file` ends here) keeps the mapping.
  return absl::WrapUnique(new MappedFile(
      path, static_cast<const uint8_t*>(data), size, release_every_bytes));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
}

void MappedFile::NoteRead(uint64_t bytes) const {
  const uint64_t total =
      read_since_release_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (total >= release_every_bytes_ &&
      read_since_release_.exchange(0, std::memory_order_relaxed) > 0) {
    ReleaseResident();
  }
}

void MappedFile::NoteRandomRead(uint64_t bytes) const {
  constexpr uint64_t kPage = 4096;
  NoteRead((bytes + kPage - 1) / kPage * kPage + kFaultAroundBytes);
}

void MappedFile::ReleaseResident() const {
  if (data_ != nullptr) {
    // A read-only file mapping: dropped pages are read again from the page
    // cache or the file on the next touch, with the same contents.
    (void)::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED);
  }
}

}  // namespace pstrain
