// No Abseil header here: see sentencepiece_shim.h.
#include "text/sentencepiece_shim.h"

#include <utility>

#include "sentencepiece_processor.h"
#include "sentencepiece_trainer.h"

namespace pstrain {
namespace spm {
namespace {

Result ToResult(const sentencepiece::util::Status& status) {
  Result r;
  r.code = static_cast<int>(status.code());
  if (!status.ok()) r.message = status.message();
  return r;
}

// The documents as SentencePiece's sentence source.
class DocumentIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit DocumentIterator(const std::vector<std::string>& documents)
      : documents_(documents) {}
  bool done() const override { return next_ >= documents_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return documents_[next_]; }
  sentencepiece::util::Status status() const override {
    return sentencepiece::util::Status();
  }

 private:
  const std::vector<std::string>& documents_;
  size_t next_ = 0;
};

}  // namespace

Result Train(const std::unordered_map<std::string, std::string>& args,
             const std::vector<std::string>& documents, std::string* model) {
  DocumentIterator iterator(documents);
  return ToResult(
      sentencepiece::SentencePieceTrainer::Train(args, &iterator, model));
}

struct Processor::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

Processor::Processor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Processor::~Processor() = default;

std::unique_ptr<Processor> Processor::Load(const std::string& bytes,
                                           Result* result) {
  auto impl = std::make_unique<Impl>();
  *result = ToResult(impl->processor.LoadFromSerializedProto(bytes));
  if (result->code != 0) return nullptr;
  return std::unique_ptr<Processor>(new Processor(std::move(impl)));
}

int Processor::PieceSize() const { return impl_->processor.GetPieceSize(); }
int Processor::PadId() const { return impl_->processor.pad_id(); }
int Processor::UnkId() const { return impl_->processor.unk_id(); }
int Processor::PieceToId(const std::string& piece) const {
  return impl_->processor.PieceToId(piece);
}

std::vector<int> Processor::Encode(const std::string& text) const {
  std::vector<int> ids;
  // Fails only for a processor without a model, which Load never returns.
  (void)impl_->processor.Encode(text, &ids);
  return ids;
}

std::string Processor::Decode(const std::vector<int>& ids) const {
  std::string text;
  (void)impl_->processor.Decode(ids, &text);
  return text;
}

}  // namespace spm
}  // namespace pstrain
