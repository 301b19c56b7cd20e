// StandardiseAs (worker/dataset.h): a loaded dataset re-standardised with
// a model's input statistics.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/dataset.h"

namespace pstrain {

absl::Status StandardiseAs(const std::vector<double>& mean,
                           const std::vector<double>& stddev,
                           Dataset* dataset) {
  if (dataset->tokens != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset ", dataset->name,
        " holds token sequences; input statistics are for images"));
  }
  const size_t channels = dataset->channel_mean.size();
  if (channels == 0 || dataset->channel_stddev.size() != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset ", dataset->name, " was not standardised (headers only)"));
  }
  if (mean.size() != channels || stddev.size() != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("input statistics for ", mean.size(), " and ",
                     stddev.size(), " channels (mean, stddev); dataset ",
                     dataset->name, " has ", channels));
  }
  for (size_t c = 0; c < channels; ++c) {
    if (!std::isfinite(mean[c]) || !std::isfinite(stddev[c]) ||
        !(stddev[c] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input statistics of channel ", c, ": mean ", mean[c], ", stddev ",
          stddev[c], "; expected finite values and a positive stddev"));
    }
  }
  const auto same = [](double a, double b) {
    return std::abs(a - b) <= 1e-8 * std::max(std::abs(a), std::abs(b));
  };
  for (size_t c = 0; c < channels; ++c) {
    const double old_mean = dataset->channel_mean[c];
    const double old_stddev = dataset->channel_stddev[c];
    if (same(old_mean, mean[c]) && same(old_stddev, stddev[c])) continue;
    // x = v * old_stddev + old_mean, so (x - mean) / stddev = v * scale +
    // shift.
    const double scale = old_stddev / stddev[c];
    const double shift = (old_mean - mean[c]) / stddev[c];
    const auto remap = [scale, shift](float* v) {
      *v = static_cast<float>(*v * scale + shift);
    };
    for (LabeledImages* split : {&dataset->train, &dataset->test}) {
      if (split->mapped != nullptr) {
        for (int b = 0; b < 256; ++b) {
          remap(&split->mapped->value_of[c * 256 + b]);
        }
        continue;
      }
      const int64_t plane = split->chw[1] * split->chw[2];
      for (int64_t i = 0; i < split->stored; ++i) {
        float* p = &split->images[(i * channels + c) * plane];
        for (int64_t j = 0; j < plane; ++j) remap(&p[j]);
      }
    }
    dataset->channel_mean[c] = mean[c];
    dataset->channel_stddev[c] = stddev[c];
  }
  return absl::OkStatus();
}

}  // namespace pstrain
