// Internal to text/: Debian's SentencePiece headers declare
// `namespace absl { using std::string_view; }`, which clashes with Debian's
// Abseil (its own absl::string_view class), so no file may include both.
// This header (std types only) is the one door to SentencePiece;
// sentencepiece_shim.cc includes SentencePiece and nothing of Abseil, and
// tokenizer.cc turns the results into absl::Status.
//
// Thread-safety: Train as SentencePieceTrainer::Train; a Processor's const
// methods may run on many threads at once.
#ifndef PSTRAIN_TEXT_SENTENCEPIECE_SHIM_H_
#define PSTRAIN_TEXT_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace pstrain {
namespace spm {

// SentencePiece's status: `code` in absl::StatusCode's numbering (0 = ok).
struct Result {
  int code = 0;
  std::string message;
};

// SentencePieceTrainer::Train(args, the documents as sentences, model).
Result Train(const std::unordered_map<std::string, std::string>& args,
             const std::vector<std::string>& documents, std::string* model);

class Processor {
 public:
  // A processor for the serialized model `bytes`; null with `result` set
  // when they are not a model.
  static std::unique_ptr<Processor> Load(const std::string& bytes,
                                         Result* result);
  ~Processor();
  int PieceSize() const;
  int PadId() const;
  int UnkId() const;
  int PieceToId(const std::string& piece) const;
  std::vector<int> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int>& ids) const;

 private:
  struct Impl;
  explicit Processor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spm
}  // namespace pstrain

#endif  // PSTRAIN_TEXT_SENTENCEPIECE_SHIM_H_
