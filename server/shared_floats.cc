#include "server/shared_floats.h"

#include <utility>

namespace pstrain {

SharedFloats::SharedFloats(std::vector<float> values)
    : storage_(std::make_shared<std::vector<float>>(std::move(values))) {}

SharedFloats& SharedFloats::operator=(std::vector<float> values) {
  storage_ = std::make_shared<std::vector<float>>(std::move(values));
  return *this;
}

std::vector<float> SharedFloats::ToVector() const {
  return storage_ ? *storage_ : std::vector<float>();
}

float* SharedFloats::mutable_data() {
  if (!storage_) return nullptr;
  if (storage_.use_count() > 1) {
    // A reply holds it: it keeps the old storage, this the copy.
    storage_ = std::make_shared<std::vector<float>>(*storage_);
  }
  return storage_->data();
}

float* SharedFloats::overwrite_data(size_t n) {
  if (!storage_ || storage_.use_count() > 1) {
    storage_ = std::make_shared<std::vector<float>>(n);
  } else {
    storage_->resize(n);
  }
  return storage_->data();
}

}  // namespace pstrain
