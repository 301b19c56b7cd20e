#include "server/shared_floats.h"

#include <atomic>
#include <utility>

namespace pstrain {

SharedFloats::SharedFloats(std::vector<float> values)
    : storage_(std::make_shared<std::vector<float>>(std::move(values))) {}

SharedFloats& SharedFloats::operator=(std::vector<float> values) {
  storage_ = std::make_shared<std::vector<float>>(std::move(values));
  halves_.reset();
  return *this;
}

std::vector<float> SharedFloats::ToVector() const {
  return storage_ ? *storage_ : std::vector<float>();
}

bool SharedFloats::Unshared() const {
  if (storage_.use_count() > 1) return false;
  // use_count() is a relaxed load. A reply's last read of the storage
  // comes before its release of the reference (shared_ptr drops a
  // reference with acquire-release ordering); this fence orders that read
  // before the writes that follow here.
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

float* SharedFloats::mutable_data() {
  halves_.reset();
  if (!storage_) return nullptr;
  if (!Unshared()) {
    // A reply holds it: it keeps the old storage, this the copy.
    storage_ = std::make_shared<std::vector<float>>(*storage_);
  }
  return storage_->data();
}

float* SharedFloats::overwrite_data(size_t n) {
  halves_.reset();
  if (!storage_ || !Unshared()) {
    storage_ = std::make_shared<std::vector<float>>(n);
  } else {
    storage_->resize(n);
  }
  return storage_->data();
}

std::shared_ptr<const EncodedHalves> SharedFloats::ShareHalves(DType dtype) {
  if (empty()) return nullptr;
  if (halves_ == nullptr || halves_->dtype != dtype) {
    halves_ =
        std::make_shared<const EncodedHalves>(EncodeHalvesOf(span(), dtype));
  }
  return halves_;
}

}  // namespace pstrain
