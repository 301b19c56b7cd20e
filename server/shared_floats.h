// SharedFloats: a shard chunk's fp32 weights, which a pull reply can hold
// while gRPC writes it out instead of copying them (copy-on-write).
//
// A shard keeps two weight buffers per chunk and swaps them at each update
// (server/parameter_shard.h); a reply holding the current one (Share())
// keeps that storage alive and unchanged: a later write to it goes to new
// storage (mutable_data() copies the values over first, overwrite_data()
// does not, for a write of every element), and the reply's reference frees
// the old storage when gRPC lets go of it, on whichever thread that is.
//
// A pull in a 16-bit wire dtype gets the values converted once per write
// (ShareHalves): the first reply after a write converts them, every later
// one, until the next write, shares that conversion (the form is dropped
// by each write access, and moves with its values in swap()).
//
// Thread-compatible, as a std::vector: the owner's lock guards every call
// but the release of a Share()d reference, which may happen on any thread.
// Uniqueness is read from the reference count: a count of 1 under the
// owner's lock cannot grow (only Share() adds references), so a storage
// seen unshared is written in place; a count read high while a reply drops
// its reference costs one needless copy, never a shared write.
#ifndef PSTRAIN_SERVER_SHARED_FLOATS_H_
#define PSTRAIN_SERVER_SHARED_FLOATS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/wire_dtype.h"

namespace pstrain {

class SharedFloats {
 public:
  SharedFloats() = default;
  // Takes `values` over (no copy).
  explicit SharedFloats(std::vector<float> values);
  SharedFloats& operator=(std::vector<float> values);

  // A SharedFloats is moved or swapped, never copied implicitly (a copy
  // would share storage that both sides then think they own).
  SharedFloats(SharedFloats&&) noexcept = default;
  SharedFloats& operator=(SharedFloats&&) noexcept = default;
  SharedFloats(const SharedFloats&) = delete;
  SharedFloats& operator=(const SharedFloats&) = delete;

  size_t size() const { return storage_ ? storage_->size() : 0; }
  bool empty() const { return size() == 0; }
  // Read access (valid until the next non-const call).
  const float* data() const { return storage_ ? storage_->data() : nullptr; }
  absl::Span<const float> span() const { return {data(), size()}; }
  // A copy of the values.
  std::vector<float> ToVector() const;

  // Write access that keeps the values: the storage, copied into a new
  // one first if a reply holds it.
  float* mutable_data();
  // Write access for a write of every one of `n` elements (the values are
  // then unspecified): the storage resized to `n` if unshared, else a new
  // one of `n` elements.
  float* overwrite_data(size_t n);

  void swap(SharedFloats& other) noexcept {
    storage_.swap(other.storage_);
    halves_.swap(other.halves_);
  }

  // A reference that keeps the current values' storage alive and unchanged
  // until it is released (null when empty). For pull replies.
  std::shared_ptr<const std::vector<float>> Share() const { return storage_; }

  // The values in `dtype` (DTYPE_BFLOAT16 or DTYPE_FLOAT16,
  // EncodeHalvesOf), converted at the first call since the last write
  // access and shared by the calls after it (null when empty). The form
  // is immutable: a reply holds it as long as it needs; the next write
  // access drops this object's reference. A call for the other 16-bit
  // dtype converts again (one form is kept).
  std::shared_ptr<const EncodedHalves> ShareHalves(DType dtype);

  // Whether a Share()d reference still holds the storage (tests).
  bool shared() const { return storage_ && storage_.use_count() > 1; }

 private:
  // Whether no reply holds the (non-null) storage, so that it may be
  // written in place.
  bool Unshared() const;

  std::shared_ptr<std::vector<float>> storage_;
  // The values' 16-bit form (ShareHalves), or null: none since the last
  // write access.
  std::shared_ptr<const EncodedHalves> halves_;
};

}  // namespace pstrain

#endif  // PSTRAIN_SERVER_SHARED_FLOATS_H_
