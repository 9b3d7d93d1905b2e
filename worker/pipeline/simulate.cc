#include "worker/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zo::pipeline {
namespace {

// (is_gradient, micro_batch, virtual stage of the sender).
using MessageKey = std::tuple<bool, int, int>;

std::string KeyString(const MessageKey& key) {
  return absl::StrCat(std::get<0>(key) ? "gradient" : "activation", " of micro-batch ",
                      std::get<1>(key), " from virtual stage ", std::get<2>(key));
}

struct StageState {
  size_t pc = 0;     // next instruction
  double clock = 0;  // when the stage is free to run it
  double busy = 0;
  std::set<std::pair<int, int>> live;  // (micro_batch, chunk) forwarded, not yet backwarded
  std::set<std::pair<int, int>> done_forward;
  int peak = 0;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(absl::Span<const StageProgram> programs,
                                          const SimulationOptions& options) {
  const int stages = static_cast<int>(programs.size());
  if (stages == 0) return absl::InvalidArgumentError("pipeline simulation needs >= 1 stage");

  std::vector<StageState> state(stages);
  std::map<MessageKey, double> in_flight;  // sent, not yet received -> send time
  std::set<MessageKey> ever_sent;

  auto where = [&](int stage, size_t pc) {
    return absl::StrCat("stage ", stage, " instruction ", pc, " ", ToString(programs[stage][pc]));
  };

  // Runs stage `s` until it finishes or waits on a receive. Sends carry
  // their time, so the result does not depend on the order stages run in.
  auto advance = [&](int s, bool* progressed) -> absl::Status {
    StageState& st = state[s];
    const StageProgram& program = programs[s];
    while (st.pc < program.size()) {
      const Instruction& in = program[st.pc];
      const int virtual_stage = in.chunk * stages + s;
      const std::pair<int, int> unit{in.micro_batch, in.chunk};
      switch (in.op) {
        case Op::kRecvActivation:
        case Op::kRecvGrad: {
          const bool grad = in.op == Op::kRecvGrad;
          const int from = grad ? virtual_stage + 1 : virtual_stage - 1;
          if (from < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(where(s, st.pc), " receives from a virtual stage below 0"));
          }
          auto it = in_flight.find(MessageKey{grad, in.micro_batch, from});
          if (it == in_flight.end()) return absl::OkStatus();  // blocked
          st.clock = std::max(st.clock, it->second);
          in_flight.erase(it);
          break;
        }
        case Op::kSendActivation:
        case Op::kSendGrad: {
          const bool grad = in.op == Op::kSendGrad;
          if (grad && virtual_stage == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(where(s, st.pc), " sends a gradient below virtual stage 0"));
          }
          const MessageKey key{grad, in.micro_batch, virtual_stage};
          if (!ever_sent.insert(key).second) {
            return absl::InvalidArgumentError(
                absl::StrCat(where(s, st.pc), " repeats the send of ", KeyString(key)));
          }
          in_flight.emplace(key, st.clock);
          break;
        }
        case Op::kForward:
          if (!st.done_forward.insert(unit).second) {
            return absl::InvalidArgumentError(absl::StrCat(where(s, st.pc), " repeats a forward"));
          }
          st.live.insert(unit);
          st.peak = std::max(st.peak, static_cast<int>(st.live.size()));
          st.clock += options.forward_time;
          st.busy += options.forward_time;
          break;
        case Op::kBackward:
          if (st.live.erase(unit) == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(where(s, st.pc), " runs without its forward, or twice"));
          }
          st.clock += options.backward_time;
          st.busy += options.backward_time;
          break;
        case Op::kLoadMicroBatch:
        case Op::kPullWeights:
        case Op::kPushGradients:
          break;
      }
      ++st.pc;
      *progressed = true;
    }
    return absl::OkStatus();
  };

  for (;;) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      if (absl::Status status = advance(s, &progressed); !status.ok()) return status;
    }
    std::vector<std::string> stuck;
    for (int s = 0; s < stages; ++s) {
      if (state[s].pc < programs[s].size()) stuck.push_back(where(s, state[s].pc));
    }
    if (stuck.empty()) break;
    if (!progressed) {
      return absl::FailedPreconditionError(
          absl::StrCat("pipeline schedule deadlocks; stuck: ", absl::StrJoin(stuck, "; ")));
    }
  }

  if (!in_flight.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline schedule sends ", KeyString(in_flight.begin()->first),
                     " but no stage receives it (", in_flight.size(), " unreceived sends)"));
  }

  SimulationResult result;
  double total_busy = 0;
  for (const StageState& st : state) {
    result.makespan = std::max(result.makespan, st.clock);
    result.busy_time.push_back(st.busy);
    result.peak_activations.push_back(st.peak);
    total_busy += st.busy;
  }
  result.bubble_fraction =
      result.makespan > 0 ? 1.0 - total_busy / (stages * result.makespan) : 0.0;
  return result;
}

}  // namespace zo::pipeline
