#include "common/utf8.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

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
