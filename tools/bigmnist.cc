#include "tools/bigmnist.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/dataset.h"

namespace pstrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

// SplitMix64 (Steele, Lea and Flood 2014): the per-image generator, and the
// hash of (seed, image) that seeds it.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // U[0, 1) from the top 53 bits, the same on every platform.
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
};

// Separable Gaussian blur of `field` (h x w) with zero outside, in place.
void GaussianBlur(std::vector<double>* field, int h, int w, double sigma) {
  const int radius = static_cast<int>(std::ceil(4.0 * sigma));
  std::vector<double> kernel(2 * radius + 1);
  double total = 0;
  for (int i = -radius; i <= radius; ++i) {
    kernel[i + radius] = std::exp(-0.5 * i * i / (sigma * sigma));
    total += kernel[i + radius];
  }
  for (double& k : kernel) k /= total;
  std::vector<double> tmp(field->size());
  const std::vector<double>& f = *field;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      double s = 0;
      for (int i = std::max(-radius, -x); i <= std::min(radius, w - 1 - x);
           ++i) {
        s += kernel[i + radius] * f[y * w + x + i];
      }
      tmp[y * w + x] = s;
    }
  }
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      double s = 0;
      for (int i = std::max(-radius, -y); i <= std::min(radius, h - 1 - y);
           ++i) {
        s += kernel[i + radius] * tmp[(y + i) * w + x];
      }
      (*field)[y * w + x] = s;
    }
  }
}

absl::Status WriteAll(FILE* f, const void* data, size_t n,
                      const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) {
    return ErrnoToStatus(errno, path);
  }
  return absl::OkStatus();
}

// An IDX header: magic 0x000008NN and the big-endian dimensions.
std::vector<uint8_t> IdxHeader(const std::vector<int64_t>& dims) {
  std::vector<uint8_t> h = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int64_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) h.push_back((d >> s) & 0xff);
  }
  return h;
}

class IdxOut {
 public:
  static absl::StatusOr<std::unique_ptr<IdxOut>> Open(
      const std::string& path, const std::vector<int64_t>& dims) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return ErrnoToStatus(errno, path);
    auto out = std::unique_ptr<IdxOut>(new IdxOut(path, f));
    const std::vector<uint8_t> header = IdxHeader(dims);
    RETURN_IF_ERROR(WriteAll(f, header.data(), header.size(), path));
    return out;
  }
  ~IdxOut() {
    if (file_ != nullptr) std::fclose(file_);
  }
  absl::Status Write(const uint8_t* data, size_t n) {
    return WriteAll(file_, data, n, path_);
  }
  absl::Status Close() {
    FILE* f = file_;
    file_ = nullptr;
    if (std::fclose(f) != 0) return ErrnoToStatus(errno, path_);
    return absl::OkStatus();
  }

 private:
  IdxOut(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}
  const std::string path_;
  FILE* file_;
};

absl::Status CopyIdx(const IdxArray& array, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<IdxOut> out, IdxOut::Open(path, array.dims));
  RETURN_IF_ERROR(out->Write(array.data.data(), array.data.size()));
  return out->Close();
}

}  // namespace

void DeformImage(const uint8_t* in, int height, int width,
                 const DeformOptions& o, uint64_t seed, uint8_t* out) {
  SplitMix64 rng{seed};
  const double theta =
      rng.Uniform(-o.max_rotation_deg, o.max_rotation_deg) * kPi / 180.0;
  const double scale = rng.Uniform(1.0 - o.max_scale, 1.0 + o.max_scale);
  const double shear = rng.Uniform(-o.max_shear, o.max_shear);
  const double tx = rng.Uniform(-o.max_translation_px, o.max_translation_px);
  const double ty = rng.Uniform(-o.max_translation_px, o.max_translation_px);
  const size_t n = static_cast<size_t>(height) * width;
  std::vector<double> dx(n, 0.0), dy(n, 0.0);
  if (o.elastic_sigma > 0 && o.elastic_alpha != 0) {
    for (size_t i = 0; i < n; ++i) dx[i] = rng.Uniform(-1.0, 1.0);
    for (size_t i = 0; i < n; ++i) dy[i] = rng.Uniform(-1.0, 1.0);
    GaussianBlur(&dx, height, width, o.elastic_sigma);
    GaussianBlur(&dy, height, width, o.elastic_sigma);
  }
  // Source position of output pixel p: A (p - c) + c - t + d(p), with
  // A = R(theta) Sh(shear) / scale.
  const double c = std::cos(theta) / scale, s = std::sin(theta) / scale;
  const double a00 = c, a01 = c * shear - s, a10 = s, a11 = s * shear + c;
  const double cx = (width - 1) / 2.0, cy = (height - 1) / 2.0;
  auto pixel = [&](int y, int x) -> double {
    return (y < 0 || y >= height || x < 0 || x >= width) ? 0.0
                                                         : in[y * width + x];
  };
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const size_t i = static_cast<size_t>(y) * width + x;
      const double qx = x - cx, qy = y - cy;
      const double sx = a00 * qx + a01 * qy + cx - tx + o.elastic_alpha * dx[i];
      const double sy = a10 * qx + a11 * qy + cy - ty + o.elastic_alpha * dy[i];
      const double fx = std::floor(sx), fy = std::floor(sy);
      const int x0 = static_cast<int>(fx), y0 = static_cast<int>(fy);
      const double wx = sx - fx, wy = sy - fy;
      const double v =
          (1 - wy) * ((1 - wx) * pixel(y0, x0) + wx * pixel(y0, x0 + 1)) +
          wy * ((1 - wx) * pixel(y0 + 1, x0) + wx * pixel(y0 + 1, x0 + 1));
      out[i] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
    }
  }
}

absl::Status WriteBigMnist(const BigMnistOptions& o) {
  const DeformOptions& d = o.deform;
  if (o.copies < 1 || o.threads < 1 || !(d.max_rotation_deg >= 0) ||
      !(d.max_scale >= 0 && d.max_scale < 1) || !(d.max_shear >= 0) ||
      !(d.max_translation_px >= 0) || !(d.elastic_sigma >= 0) ||
      !(d.elastic_alpha >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bigmnist: copies ", o.copies, ", threads ", o.threads, ", rotation ",
        d.max_rotation_deg, ", scale ", d.max_scale, ", shear ", d.max_shear,
        ", translation ", d.max_translation_px, ", alpha ", d.elastic_alpha,
        ", sigma ", d.elastic_sigma,
        "; expected copies and threads >= 1, bounds >= 0, scale < 1"));
  }
  auto find = [&](const std::string& base) {
    return FindIdxFile(o.input_dir, base);
  };
  ASSIGN_OR_RETURN(IdxArray images, ReadIdx(find("train-images-idx3-ubyte")));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(find("train-labels-idx1-ubyte")));
  ASSIGN_OR_RETURN(IdxArray test_images,
                   ReadIdx(find("t10k-images-idx3-ubyte")));
  ASSIGN_OR_RETURN(IdxArray test_labels,
                   ReadIdx(find("t10k-labels-idx1-ubyte")));
  if (images.dims.size() != 3 || labels.dims.size() != 1 ||
      images.dims[0] != labels.dims[0]) {
    return absl::DataLossError(absl::StrCat(
        o.input_dir,
        ": expected train-images (3 dims) and train-labels (1 dim) of the "
        "same count"));
  }
  const int64_t count = images.dims[0];
  const int height = static_cast<int>(images.dims[1]);
  const int width = static_cast<int>(images.dims[2]);
  const int64_t total = count * o.copies;
  if (total > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bigmnist: ", count, " images x ", o.copies, " copies = ", total,
        "; expected at most 2^31 (the IDX dimension limit)"));
  }
  ::mkdir(o.output_dir.c_str(), 0755);
  const std::string dir = o.output_dir;
  ASSIGN_OR_RETURN(
      std::unique_ptr<IdxOut> image_out,
      IdxOut::Open(dir + "/train-images-idx3-ubyte", {total, height, width}));
  ASSIGN_OR_RETURN(std::unique_ptr<IdxOut> label_out,
                   IdxOut::Open(dir + "/train-labels-idx1-ubyte", {total}));
  const size_t per = static_cast<size_t>(height) * width;
  constexpr int64_t kBlock = 8192;
  std::vector<uint8_t> block(kBlock * per), block_labels(kBlock);
  for (int64_t begin = 0; begin < total; begin += kBlock) {
    const int64_t n = std::min(kBlock, total - begin);
    auto work = [&](int t) {
      for (int64_t j = t; j < n; j += o.threads) {
        const int64_t out_index = begin + j;
        const int64_t copy = out_index / count, source = out_index % count;
        const uint8_t* src = &images.data[source * per];
        uint8_t* dst = &block[j * per];
        block_labels[j] = labels.data[source];
        if (copy == 0 && o.include_originals) {
          std::copy(src, src + per, dst);
          continue;
        }
        SplitMix64 hash{o.seed ^ (0x5851f42d4c957f2dull *
                                  static_cast<uint64_t>(out_index + 1))};
        DeformImage(src, height, width, o.deform, hash.Next(), dst);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < o.threads; ++t) threads.emplace_back(work, t);
    work(0);
    for (std::thread& t : threads) t.join();
    RETURN_IF_ERROR(image_out->Write(block.data(), n * per));
    RETURN_IF_ERROR(label_out->Write(block_labels.data(), n));
  }
  RETURN_IF_ERROR(image_out->Close());
  RETURN_IF_ERROR(label_out->Close());
  RETURN_IF_ERROR(CopyIdx(test_images, dir + "/t10k-images-idx3-ubyte"));
  return CopyIdx(test_labels, dir + "/t10k-labels-idx1-ubyte");
}

}  // namespace pstrain
