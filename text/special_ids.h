// The special token ids of pstrain's tokenizers (text/tokenizer.h) and
// masked-language-model data (text/mlm_data.h): 0 padding, 1 unknown, 2
// [CLS], 3 [SEP], 4 [MASK]; ordinary pieces are ids 5 to vocab_size - 1.
// A header of its own so that readers of token files need not link
// SentencePiece (third_party/BUILD says why they must not).
#ifndef PSTRAIN_TEXT_SPECIAL_IDS_H_
#define PSTRAIN_TEXT_SPECIAL_IDS_H_

#include <cstdint>

namespace pstrain {

inline constexpr int32_t kPadId = 0;
inline constexpr int32_t kUnknownId = 1;
inline constexpr int32_t kClsId = 2;
inline constexpr int32_t kSepId = 3;
inline constexpr int32_t kMaskId = 4;
// The first id of an ordinary piece.
inline constexpr int32_t kFirstPieceId = 5;

}  // namespace pstrain

#endif  // PSTRAIN_TEXT_SPECIAL_IDS_H_
