#include "text/mlm_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "common/status_macros.h"
#include "models/tensor.h"
#include "text/special_ids.h"

namespace pstrain {
namespace {

// SplitMix64's finaliser (Steele et al. 2014): decorrelates nearby seeds.
uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9E3779B97F4A7C15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// An empty batch of `n` sequences of `seq_len`.
MlmBatch EmptyBatch(int64_t n, int64_t seq_len) {
  MlmBatch batch;
  batch.ids = Tensor({n, seq_len});
  batch.padding_mask = Tensor({n, seq_len});
  batch.labels.assign(n * seq_len, kIgnoreLabel);
  return batch;
}

// Row `row` of `batch` from `ids` (seq_len tokens), masked with `rng`.
void FillRow(MlmBatch* batch, int64_t row, std::vector<int32_t>& ids,
             const MlmMasker& masker, std::mt19937_64& rng) {
  const int64_t s = static_cast<int64_t>(ids.size());
  for (int64_t t = 0; t < s; ++t) {
    batch->padding_mask.data[row * s + t] = ids[t] == kPadId ? 1.0f : 0.0f;
  }
  masker.Mask(absl::MakeSpan(ids),
              absl::MakeSpan(batch->labels).subspan(row * s, s), rng);
  for (int64_t t = 0; t < s; ++t) {
    batch->ids.data[row * s + t] = static_cast<float>(ids[t]);
  }
}

constexpr char kTokenMagic[] = "PSTOKEN1";
constexpr size_t kTokenHeaderBytes = 8 + 4 + 4 + 8;
constexpr uint64_t kMaxTokenFileBytes = uint64_t{4} << 30;

template <typename T>
void Put(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and arm64: little-endian.
  out->append(bytes, sizeof(T));
}

}  // namespace

absl::Status WriteTokenFile(const std::string& path,
                            const TokenSequences& sequences, int vocab_size) {
  std::string header(kTokenMagic, 8);
  Put<uint32_t>(&header, static_cast<uint32_t>(sequences.seq_len));
  Put<uint32_t>(&header, static_cast<uint32_t>(vocab_size));
  Put<uint64_t>(&header, static_cast<uint64_t>(sequences.size()));
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(
      reinterpret_cast<const char*>(sequences.tokens.data()),
      static_cast<std::streamsize>(sequences.tokens.size() * sizeof(int32_t)));
  file.close();
  if (!file) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot write the token file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenSpan> ParseTokenFile(const std::string& path,
                                         const uint8_t* bytes, size_t size,
                                         int* vocab_size) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a pstrain token file: ", why));
  };
  if (size < kTokenHeaderBytes || std::memcmp(bytes, kTokenMagic, 8) != 0) {
    return bad("no PSTOKEN1 header");
  }
  uint32_t seq_len = 0, vocab = 0;
  uint64_t count = 0;
  std::memcpy(&seq_len, bytes + 8, 4);
  std::memcpy(&vocab, bytes + 12, 4);
  std::memcpy(&count, bytes + 16, 8);
  if (seq_len < 1 || count > (size - kTokenHeaderBytes) / 4 / seq_len ||
      size != kTokenHeaderBytes + count * seq_len * sizeof(int32_t)) {
    return bad(
        absl::StrCat(count, " sequences of ", seq_len, " in ", size, " bytes"));
  }
  if (vocab > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return bad(absl::StrCat("vocabulary ", vocab, " over 2^31 - 1"));
  }
  TokenSpan span;
  span.seq_len = seq_len;
  span.count = static_cast<int64_t>(count);
  span.ids = reinterpret_cast<const int32_t*>(bytes + kTokenHeaderBytes);
  const uint64_t ids = count * seq_len;
  for (uint64_t i = 0; i < ids; ++i) {
    const int32_t id = span.ids[i];
    if (id < 0 || static_cast<uint32_t>(id) >= vocab) {
      return bad(absl::StrCat("id ", id, " of sequence ", i / seq_len,
                              " outside [0, ", vocab, ")"));
    }
  }
  *vocab_size = static_cast<int>(vocab);
  return span;
}

absl::StatusOr<TokenFile> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadSmallFile(path, kMaxTokenFileBytes);
  if (!bytes.ok()) return bytes.status();
  // Copied into int32s first: a std::string's bytes need not be aligned.
  std::vector<int32_t> words((bytes->size() + 3) / 4);
  std::memcpy(words.data(), bytes->data(), bytes->size());
  TokenFile out;
  ASSIGN_OR_RETURN(
      const TokenSpan span,
      ParseTokenFile(path, reinterpret_cast<const uint8_t*>(words.data()),
                     bytes->size(), &out.vocab_size));
  out.sequences.seq_len = span.seq_len;
  out.sequences.tokens.assign(span.ids, span.ids + span.count * span.seq_len);
  return out;
}

TokenSequences SyntheticSequences(int64_t count, int64_t seq_len,
                                  int vocab_size, uint64_t seed) {
  TokenSequences out;
  out.seq_len = seq_len;
  out.tokens.resize(count * seq_len);
  std::mt19937_64 rng(Mix(seed, 0x5EC5));
  std::uniform_int_distribution<int32_t> token(kFirstPieceId, vocab_size - 1);
  for (int64_t i = 0; i < count; ++i) {
    out.tokens[i * seq_len] = kClsId;
    for (int64_t t = 1; t < seq_len; ++t)
      out.tokens[i * seq_len + t] = token(rng);
  }
  return out;
}

absl::StatusOr<TokenSequences> PackSequences(
    const std::vector<std::vector<int32_t>>& documents, int64_t seq_len) {
  if (seq_len < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len ", seq_len, "; expected >= 2"));
  }
  std::vector<int32_t> stream;
  for (const std::vector<int32_t>& doc : documents) {
    if (doc.empty()) continue;
    stream.insert(stream.end(), doc.begin(), doc.end());
    stream.push_back(kSepId);
  }
  if (stream.empty()) {
    return absl::InvalidArgumentError("no tokens to pack into sequences");
  }
  TokenSequences out;
  out.seq_len = seq_len;
  const int64_t window = seq_len - 1;
  const int64_t n = (static_cast<int64_t>(stream.size()) + window - 1) / window;
  out.tokens.assign(n * seq_len, kPadId);
  for (int64_t i = 0; i < n; ++i) {
    out.tokens[i * seq_len] = kClsId;
    const int64_t begin = i * window;
    const int64_t end =
        std::min<int64_t>(begin + window, static_cast<int64_t>(stream.size()));
    std::copy(stream.begin() + begin, stream.begin() + end,
              out.tokens.begin() + i * seq_len + 1);
  }
  return out;
}

absl::StatusOr<MlmMasker> MlmMasker::Create(int vocab_size,
                                            const MlmMaskingOptions& options) {
  auto in_unit = [](double x) { return x >= 0.0 && x <= 1.0; };
  if (vocab_size <= kFirstPieceId || !in_unit(options.predict_fraction) ||
      !in_unit(options.mask_fraction) || !in_unit(options.random_fraction) ||
      options.mask_fraction + options.random_fraction > 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLM masking: vocab_size ", vocab_size, " (expected > ", kFirstPieceId,
        "), predict_fraction ", options.predict_fraction, ", mask_fraction ",
        options.mask_fraction, ", random_fraction ", options.random_fraction,
        " (expected fractions in [0, 1], mask + random <= 1)"));
  }
  return MlmMasker(vocab_size, options);
}

void MlmMasker::Mask(absl::Span<int32_t> ids, absl::Span<int32_t> labels,
                     std::mt19937_64& rng) const {
  std::fill(labels.begin(), labels.end(), kIgnoreLabel);
  std::vector<size_t> candidates;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] >= kFirstPieceId || ids[t] == kUnknownId)
      candidates.push_back(t);
  }
  if (candidates.empty()) return;
  const size_t count = std::max<size_t>(
      1, static_cast<size_t>(
             std::llround(options_.predict_fraction * candidates.size())));
  // The first `count` of a partial Fisher-Yates shuffle.
  for (size_t i = 0; i < count && i < candidates.size(); ++i) {
    std::uniform_int_distribution<size_t> pick(i, candidates.size() - 1);
    std::swap(candidates[i], candidates[pick(rng)]);
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int32_t> token(kFirstPieceId, vocab_size_ - 1);
  for (size_t i = 0; i < count && i < candidates.size(); ++i) {
    const size_t t = candidates[i];
    labels[t] = ids[t];
    const double u = unit(rng);
    if (u < options_.mask_fraction) {
      ids[t] = kMaskId;
    } else if (u < options_.mask_fraction + options_.random_fraction) {
      ids[t] = token(rng);
    }
  }
}

MlmBatch MakeMlmBatch(const TokenSpan& sequences,
                      absl::Span<const int64_t> indices,
                      const MlmMasker& masker, uint64_t seed, int64_t epoch) {
  const int64_t s = sequences.seq_len;
  MlmBatch batch = EmptyBatch(static_cast<int64_t>(indices.size()), s);
  std::vector<int32_t> ids(s);
  for (size_t row = 0; row < indices.size(); ++row) {
    const int64_t index = indices[row];
    std::copy_n(sequences.ids + index * s, s, ids.begin());
    std::mt19937_64 rng(Mix(Mix(seed, static_cast<uint64_t>(epoch)),
                            static_cast<uint64_t>(index)));
    FillRow(&batch, static_cast<int64_t>(row), ids, masker, rng);
  }
  return batch;
}

MlmBatch SyntheticMlmBatch(int64_t n, int64_t seq_len, const MlmMasker& masker,
                           uint64_t seed, int64_t step) {
  MlmBatch batch = EmptyBatch(n, seq_len);
  std::mt19937_64 rng(Mix(seed, static_cast<uint64_t>(step)));
  std::uniform_int_distribution<int32_t> token(kFirstPieceId,
                                               masker.vocab_size() - 1);
  std::vector<int32_t> ids(seq_len);
  for (int64_t row = 0; row < n; ++row) {
    ids[0] = kClsId;
    for (int64_t t = 1; t < seq_len; ++t) ids[t] = token(rng);
    FillRow(&batch, row, ids, masker, rng);
  }
  return batch;
}

}  // namespace pstrain
