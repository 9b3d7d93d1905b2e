#include "ctl/message_json.h"

#include <utility>

#include "google/protobuf/descriptor.h"

namespace zo::ctl {

nlohmann::ordered_json MessageToJson(const google::protobuf::Message& msg) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = msg.GetDescriptor();
  const google::protobuf::Reflection* r = msg.GetReflection();
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto value = [&](int index) -> nlohmann::ordered_json {
      const bool rep = f->is_repeated();
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          return rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f);
        case FieldDescriptor::CPPTYPE_INT64:
          return rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f);
        case FieldDescriptor::CPPTYPE_UINT32:
          return rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f);
        case FieldDescriptor::CPPTYPE_UINT64:
          return rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f);
        case FieldDescriptor::CPPTYPE_DOUBLE:
          return rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f);
        case FieldDescriptor::CPPTYPE_FLOAT:
          return rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f);
        case FieldDescriptor::CPPTYPE_BOOL:
          return rep ? r->GetRepeatedBool(msg, f, index) : r->GetBool(msg, f);
        case FieldDescriptor::CPPTYPE_STRING:
          return rep ? r->GetRepeatedString(msg, f, index) : r->GetString(msg, f);
        case FieldDescriptor::CPPTYPE_ENUM:
          return (rep ? r->GetRepeatedEnum(msg, f, index) : r->GetEnum(msg, f))->name();
        case FieldDescriptor::CPPTYPE_MESSAGE:
          return MessageToJson(rep ? r->GetRepeatedMessage(msg, f, index) : r->GetMessage(msg, f));
      }
      return nullptr;
    };
    if (f->is_repeated()) {
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (int k = 0; k < r->FieldSize(msg, f); ++k) items.push_back(value(k));
      j[f->name()] = std::move(items);
    } else {
      j[f->name()] = value(0);
    }
  }
  return j;
}

}  // namespace zo::ctl
