// A protobuf message as JSON for zo-ctl's --json output.
#ifndef ZO_CTL_MESSAGE_JSON_H_
#define ZO_CTL_MESSAGE_JSON_H_

#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace zo::ctl {

// Every field of `msg` under its proto name, in field order, set or not:
// integers (int64 too, unlike protobuf's own JSON mapping, which quotes
// them) as JSON numbers, floats, strings, booleans, enums by name, messages
// as objects, repeated fields as arrays.
nlohmann::ordered_json MessageToJson(const google::protobuf::Message& msg);

}  // namespace zo::ctl

#endif  // ZO_CTL_MESSAGE_JSON_H_
