#include "common/utf8.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/common.h"

namespace pstrain {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The path and value of the first field of `message` that is not UTF-8;
// an empty path if none.
std::pair<std::string, std::string> FirstNonUtf8(const Message& message,
                                                 const std::string& prefix) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string name = absl::StrCat(prefix, field->name());
    const int count =
        field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string path =
          field->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        const std::string value =
            field->is_repeated()
                ? reflection->GetRepeatedString(message, field, i)
                : reflection->GetString(message, field);
        // protobuf's own test of a `string` field's bytes on parse.
        if (!google::protobuf::internal::IsStructurallyValidUTF8(
                value.data(), static_cast<int>(value.size()))) {
          return {path, value};
        }
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        auto bad =
            FirstNonUtf8(field->is_repeated()
                             ? reflection->GetRepeatedMessage(message, field, i)
                             : reflection->GetMessage(message, field),
                         absl::StrCat(path, "."));
        if (!bad.first.empty()) return bad;
      }
    }
  }
  return {};
}

// Bytes of the UTF-8 character `text` starts with (1 to 4), or 0 if its
// first byte begins none (RFC 3629 section 4: no overlong forms, no
// surrogates, nothing past U+10FFFF, no character cut short).
size_t Utf8CharBytes(absl::string_view text) {
  const auto byte = [&text](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char first = byte(0);
  if (first < 0x80) return 1;
  size_t bytes = 0;
  // The range of the second byte; the others are 0x80..0xBF.
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (first >= 0xC2 && first <= 0xDF) {
    bytes = 2;
  } else if (first >= 0xE0 && first <= 0xEF) {
    bytes = 3;
    if (first == 0xE0) low = 0xA0;   // overlong
    if (first == 0xED) high = 0x9F;  // surrogates
  } else if (first >= 0xF0 && first <= 0xF4) {
    bytes = 4;
    if (first == 0xF0) low = 0x90;   // overlong
    if (first == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < bytes || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < bytes; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return bytes;
}

bool IsUtf8(absl::string_view text) {
  return google::protobuf::internal::IsStructurallyValidUTF8(
      text.data(), static_cast<int>(text.size()));
}

int EscapeFields(Message* message) {
  const Reflection* reflection = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);
  int changed = 0;
  for (const FieldDescriptor* field : fields) {
    const int count =
        field->is_repeated() ? reflection->FieldSize(*message, field) : 1;
    for (int i = 0; i < count; ++i) {
      if (field->type() == FieldDescriptor::TYPE_STRING) {
        std::string scratch;
        const std::string& value =
            field->is_repeated()
                ? reflection->GetRepeatedStringReference(*message, field, i,
                                                         &scratch)
                : reflection->GetStringReference(*message, field, &scratch);
        if (IsUtf8(value)) continue;
        std::string escaped = EscapeNonUtf8(value);
        if (field->is_repeated()) {
          reflection->SetRepeatedString(message, field, i, std::move(escaped));
        } else {
          reflection->SetString(message, field, std::move(escaped));
        }
        ++changed;
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        changed += EscapeFields(
            field->is_repeated()
                ? reflection->MutableRepeatedMessage(message, field, i)
                : reflection->MutableMessage(message, field));
      }
    }
  }
  return changed;
}

}  // namespace

std::string EscapeNonUtf8(absl::string_view text) {
  if (IsUtf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  while (!text.empty()) {
    const size_t bytes = Utf8CharBytes(text);
    if (bytes > 0) {
      out.append(text.data(), bytes);
      text.remove_prefix(bytes);
      continue;
    }
    absl::StrAppend(
        &out, "\\x",
        absl::Hex(static_cast<unsigned char>(text[0]), absl::kZeroPad2));
    text.remove_prefix(1);
  }
  return out;
}

int EscapeNonUtf8Fields(Message* message) { return EscapeFields(message); }

absl::Status CheckUtf8Fields(const Message& message) {
  const auto [path, value] = FirstNonUtf8(message, "");
  if (path.empty()) return absl::OkStatus();
  constexpr size_t kShown = 300;
  std::string shown = absl::CHexEscape(value.substr(0, kShown));
  if (value.size() > kShown) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": \"", shown, "\" is not UTF-8; expected UTF-8 text"));
}

}  // namespace pstrain
