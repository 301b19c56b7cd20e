#include "tools/bigmnist.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/dataset.h"

namespace pstrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The four files of an MNIST-style folder, read from the input (plain or
// .gz) and written to the output (plain), in this order.
constexpr const char* kOutputNames[] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

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

// An IDX file written beside its final name (`path`.tmp, created anew) and
// renamed over it by Close(), so that a reader never sees a partial file and
// whatever `path` was (a link, another name of a source file) is replaced,
// never written through. Removed when not closed.
class IdxOut {
 public:
  static absl::StatusOr<std::unique_ptr<IdxOut>> Open(
      const std::string& path, const std::vector<int64_t>& dims) {
    const std::string tmp = path + ".tmp";
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, tmp);
    }
    const int fd =
        ::open(tmp.c_str(),
               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, tmp);
    FILE* f = ::fdopen(fd, "wb");
    if (f == nullptr) {
      const int error = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoToStatus(error, tmp);
    }
    auto out = std::unique_ptr<IdxOut>(new IdxOut(path, tmp, f));
    const std::vector<uint8_t> header = IdxHeader(dims);
    RETURN_IF_ERROR(WriteAll(f, header.data(), header.size(), tmp));
    return out;
  }
  ~IdxOut() {
    if (file_ != nullptr) {
      std::fclose(file_);
      ::unlink(tmp_.c_str());
    }
  }
  absl::Status Write(const uint8_t* data, size_t n) {
    return WriteAll(file_, data, n, tmp_);
  }
  absl::Status Close() {
    FILE* f = file_;
    file_ = nullptr;
    int error = 0;
    if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) error = errno;
    if (std::fclose(f) != 0 && error == 0) error = errno;
    if (error != 0) {
      ::unlink(tmp_.c_str());
      return ErrnoToStatus(error, tmp_);
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      error = errno;
      ::unlink(tmp_.c_str());
      return ErrnoToStatus(error, path_);
    }
    return absl::OkStatus();
  }

 private:
  IdxOut(std::string path, std::string tmp, FILE* file)
      : path_(std::move(path)), tmp_(std::move(tmp)), file_(file) {}
  const std::string path_;
  const std::string tmp_;
  FILE* file_;
};

absl::Status CopyIdx(const IdxArray& array, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<IdxOut> out, IdxOut::Open(path, array.dims));
  RETURN_IF_ERROR(out->Write(array.data.data(), array.data.size()));
  return out->Close();
}

// `path` absolute, lexically normal, with the links of its existing part
// resolved: two spellings of one folder compare equal, made or not.
std::filesystem::path Resolved(const std::string& path) {
  std::error_code error;
  std::filesystem::path p = std::filesystem::weakly_canonical(
      std::filesystem::absolute(path, error), error);
  if (error) return std::filesystem::path(path).lexically_normal();
  return p.has_filename() ? p : p.parent_path();  // "a/" is "a"
}

// INVALID_ARGUMENT when writing the output would replace source data: the
// output folder is the input folder (however spelled, through links too),
// or an output file already there is one of `inputs` by another name (a
// hard or symbolic link: same device and inode).
absl::Status CheckOutputIsNotInput(const BigMnistOptions& o,
                                   const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (Resolved(o.output_dir) == Resolved(o.input_dir) ||
      fs::equivalent(o.output_dir, o.input_dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--output_dir=", o.output_dir,
        ": the same folder as --input_dir=", o.input_dir,
        "; expected another folder (the output would replace the source)"));
  }
  for (const char* name : kOutputNames) {
    const std::string path = absl::StrCat(o.output_dir, "/", name);
    for (const std::string& input : inputs) {
      if (fs::equivalent(path, input, error)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--output_dir=", o.output_dir, ": its ", name, " is the input ",
            input, " by another name (a link); expected another file there"));
      }
    }
  }
  return absl::OkStatus();
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
  std::vector<std::string> inputs;
  for (const char* name : kOutputNames) {
    inputs.push_back(FindIdxFile(o.input_dir, name));
  }
  RETURN_IF_ERROR(CheckOutputIsNotInput(o, inputs));
  ASSIGN_OR_RETURN(IdxArray images, ReadIdx(inputs[0]));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(inputs[1]));
  ASSIGN_OR_RETURN(IdxArray test_images, ReadIdx(inputs[2]));
  ASSIGN_OR_RETURN(IdxArray test_labels, ReadIdx(inputs[3]));
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
