#include "worker/collective.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace pstrain {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's store interface over ours. Gloo reports errors by exception, so
// ours become gloo::IoException here and statuses again at the Collective's
// boundary.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(RendezvousStore* store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Wait(key, timeout_);
    if (!value.ok()) {
      throw gloo::IoException(std::string(value.status().message()));
    }
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, ToChrono(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      absl::StatusOr<std::string> value =
          store_->Wait(key, absl::FromChrono(timeout));
      if (!value.ok()) {
        throw gloo::IoException(std::string(value.status().message()));
      }
    }
  }

 private:
  RendezvousStore* const store_;
  const absl::Duration timeout_;
};

}  // namespace

absl::Status InProcessStore::Set(const std::string& key,
                                 const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessStore::Wait(const std::string& key,
                                                 absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return values_.count(key) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key \"", key, "\" was not set in time"));
  }
  return values_[key];
}

namespace {

// Gloo's ring over TCP.
class GlooCollective : public Collective {
 public:
  GlooCollective(int rank, int size) : Collective(rank, size) {}

  absl::Status AllreduceSum(float* data, size_t n) override;
  absl::Status AllreduceSum16(uint16_t* data, size_t n, DType dtype) override;
  absl::Status AllreduceMax(float* data, size_t n) override;
  absl::Status Allgather(const void* in, size_t bytes, void* out) override;
  absl::Status Broadcast(float* data, size_t n, int root) override;

  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  // Gloo's ring allreduce of `n` values at `data` with `reduce`; `what`
  // names it in the error (DEADLINE_EXCEEDED with Gloo's message).
  template <typename T>
  absl::Status RingAllreduce(T* data, size_t n, ReduceFn reduce,
                             const std::string& what);

  std::shared_ptr<gloo::Context> context_;
  // Gloo matches the operations of the ranks by tag.
  uint32_t next_tag_ = 1;
};

}  // namespace

absl::Status Collective::Check16(DType dtype) {
  if (dtype == DTYPE_BFLOAT16 || dtype == DTYPE_FLOAT16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("16-bit allreduce of dtype ", DType_Name(dtype),
                   ": expected DTYPE_BFLOAT16 or DTYPE_FLOAT16"));
}

absl::Status Collective::CheckRank(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective rank ", rank, " of ", size, ": expected 0 <= rank < size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Collective>> Collective::CreateGloo(
    int rank, int size, const std::string& hostname, RendezvousStore* store,
    const std::string& prefix, absl::Duration timeout) {
  absl::Status valid = CheckRank(rank, size);
  if (!valid.ok()) return valid;
  auto collective = std::make_unique<GlooCollective>(rank, size);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToChrono(timeout));
    GlooStore gloo_store(store, timeout);
    gloo::rendezvous::PrefixStore prefixed(prefix, gloo_store);
    context->connectFullMesh(prefixed, device);
    collective->context_ = std::move(context);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, " of ", size, " on ", hostname,
                     ": connecting the workers (gloo): ", e.what()));
  }
  return collective;
}

template <typename T>
absl::Status GlooCollective::RingAllreduce(T* data, size_t n, ReduceFn reduce,
                                           const std::string& what) {
  if (size() == 1 || n == 0) return absl::OkStatus();
  try {
    gloo::AllreduceOptions options(context_);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data, n);
    options.setReduceFunction(reduce);
    options.setTag(next_tag_++);
    gloo::allreduce(options);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " on rank ", rank(), ": ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::AllreduceSum(float* data, size_t n) {
  return RingAllreduce(data, n, &gloo::sum<float>,
                       absl::StrCat("allreduce of ", n, " floats"));
}

namespace {

// Gloo's reduction function over 16-bit values (Collective::AllreduceSum16)
// in the type `Widen` and `Round` convert: c[i] = Round(Widen(a[i]) +
// Widen(b[i])).
template <float (*Widen)(uint16_t), uint16_t (*Round)(float)>
void Sum16(void* c, const void* a, const void* b, size_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  uint16_t* z = static_cast<uint16_t*>(c);
  for (size_t i = 0; i < n; ++i) z[i] = Round(Widen(x[i]) + Widen(y[i]));
}

}  // namespace

absl::Status GlooCollective::AllreduceSum16(uint16_t* data, size_t n,
                                            DType dtype) {
  RETURN_IF_ERROR(Check16(dtype));
  return RingAllreduce(data, n,
                       dtype == DTYPE_BFLOAT16
                           ? &Sum16<Bfloat16ToFloat, FloatToBfloat16>
                           : &Sum16<Float16ToFloat, FloatToFloat16>,
                       absl::StrCat("allreduce of ", n, " ",
                                    WireDtypeSpelling(dtype), " values"));
}

absl::Status GlooCollective::AllreduceMax(float* data, size_t n) {
  return RingAllreduce(data, n, &gloo::max<float>,
                       absl::StrCat("max allreduce of ", n, " floats"));
}

absl::Status GlooCollective::Allgather(const void* in, size_t bytes,
                                       void* out) {
  if (bytes == 0) return absl::OkStatus();
  if (size() == 1) {
    std::memcpy(out, in, bytes);
    return absl::OkStatus();
  }
  try {
    gloo::AllgatherOptions options(context_);
    // Gloo reads the input only; its API takes a mutable pointer.
    options.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
    options.setOutput(static_cast<uint8_t*>(out), bytes * size());
    options.setTag(next_tag_++);
    gloo::allgather(options);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "allgather of ", bytes, " bytes on rank ", rank(), ": ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status BroadcastInt64(Collective& collective, int64_t* data, size_t n,
                            int root) {
  static_assert(sizeof(int64_t) == 2 * sizeof(float), "int64 as two floats");
  std::vector<float> bits(2 * n);
  std::memcpy(bits.data(), data, n * sizeof(int64_t));
  RETURN_IF_ERROR(collective.Broadcast(bits.data(), bits.size(), root));
  std::memcpy(data, bits.data(), n * sizeof(int64_t));
  return absl::OkStatus();
}

absl::Status GlooCollective::Broadcast(float* data, size_t n, int root) {
  if (size() == 1 || n == 0) return absl::OkStatus();
  try {
    gloo::BroadcastOptions options(context_);
    options.setOutput(data, n);
    options.setRoot(root);
    options.setTag(next_tag_++);
    gloo::broadcast(options);
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat("broadcast of ", n, " floats from rank ", root,
                     " on rank ", rank(), ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
