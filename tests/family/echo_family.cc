// A model family that lives only in the tests: it registers itself from this file and runs
// through `generate --stage-configs-path`, `serve` and gRPC workers (echo_family_test.py) with no
// line of it in the shared code. Two kinds: echo_shout (the entry) upper-cases the request's text
// and sends one letter per packet, a typed hand-off (Letter); echo_spell (reads echo_shout)
// answers with the letters joined by '-', one text packet per letter: "hi" -> "H-I".
#include <ATen/ATen.h>

#include <cctype>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/pipeline/model_family.h"
#include "worker/pipeline/pipeline.h"

namespace omni::pipeline {
namespace {

// What echo_shout reads of a request.
struct EchoParams : StageParams {
  std::string text;
  std::string to_json() const override { return nlohmann::json{{"text", text}}.dump(); }
};

EchoParams echo_params(const std::string& json) {
  EchoParams p;
  const auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("text") || !j.at("text").is_string()) {
    throw StageError(StageError::Code::kInvalidArgument, "", "echo: params need a string 'text'");
  }
  p.text = j.at("text").get<std::string>();
  return p;
}

// echo_shout's hand-off to echo_spell: one letter, upper case. On the wire it is a tensor;
// in one process the struct itself.
struct Letter : Payload {
  char letter = 0;
  NamedTensors tensors() const override {
    return {{"letter", at::full({1}, static_cast<int64_t>(letter), at::kLong)}};
  }
  static Letter read(const NamedTensors& wire) {
    const at::Tensor t = named_tensor(wire, "letter");
    if (!t.defined() || t.numel() != 1) {
      throw StageError(StageError::Code::kInvalidArgument, "", "echo: a packet without a letter");
    }
    Letter l;
    l.letter = static_cast<char>(t.item<int64_t>());
    return l;
  }
};

// A stage with no weights: nothing to offload, nothing on the device.
class EchoStage : public Stage {
 public:
  EchoStage(std::string name, std::string kind) : name_(std::move(name)), kind_(std::move(kind)) {}
  const std::string& name() const override { return name_; }
  std::string stats_json() override { return "{}"; }
  StageInfo info() override {
    StageInfo i;
    i.model_stage = kind_;
    return i;
  }
  uint64_t set_device_released(bool) override { return 0; }
  uint64_t device_bytes() override { return 0; }

 protected:
  static void finish(const PacketSink& sink) {
    StagePacket end;
    end.finished = true;
    end.finish_reason = "stop";
    sink(std::move(end));
  }

 private:
  std::string name_, kind_;
};

class ShoutStage : public EchoStage {
 public:
  explicit ShoutStage(const std::string& name) : EchoStage(name, "echo_shout") {}
  void run(const StageCall& call, PacketQueue&, const PacketSink& sink,
           const CancelToken& cancel) override {
    const auto params = params_as<EchoParams>(call, echo_params);
    for (const unsigned char c : params->text) {
      if (cancel.cancelled()) throw StageError(StageError::Code::kCancelled, name(), "cancelled");
      auto letter = std::make_shared<Letter>();
      letter->letter = static_cast<char>(std::toupper(c));
      StagePacket p;
      p.payload = std::move(letter);
      sink(std::move(p));
    }
    finish(sink);
  }
};

class SpellStage : public EchoStage {
 public:
  explicit SpellStage(const std::string& name) : EchoStage(name, "echo_spell") {}
  void run(const StageCall&, PacketQueue& input, const PacketSink& sink,
           const CancelToken& cancel) override {
    bool first = true;
    while (auto packet = input.pop(&cancel)) {
      const auto letter = payload_as<Letter>(*packet, &Letter::read);
      if (!letter) continue;  // the last packet
      const char c = letter->letter;
      StagePacket p;
      p.tokens = {static_cast<int64_t>(c)};
      p.text = (first ? "" : "-") + std::string(1, c);
      first = false;
      sink(std::move(p));
    }
    finish(sink);
  }
};

// The request's text: its parts' text (an API request), else `text` (--prompt).
std::string text_of(const models::ChatRequest& chat) {
  std::string text;
  for (const auto& part : chat.parts) text += part.text;
  return chat.parts.empty() ? chat.text : text;
}

StageKind shout() {
  StageKind k;
  k.name = "echo_shout";
  k.params = [](const Request& request, bool) {
    EchoParams p;
    p.text = text_of(request.chat);
    return std::make_shared<const EchoParams>(std::move(p));
  };
  k.collect = [](const StagePacket&, StageAnswer&) { return true; };
  k.make_local = [](const LocalStageOptions& o) { return std::make_unique<ShoutStage>(o.name); };
  return k;
}

StageKind spell() {
  StageKind k;
  k.name = "echo_spell";
  k.reads = {"echo_shout"};
  k.params = [](const Request&, bool) { return nullptr; };
  k.collect = [](const StagePacket& p, StageAnswer& a) {
    auto& r = a.result;
    r.tokens.insert(r.tokens.end(), p.tokens.begin(), p.tokens.end());
    r.text += p.text;
    if (p.finished) r.finish_reason = p.finish_reason;
    return p.text.empty() || !a.callbacks.on_text || a.callbacks.on_text(p.text);
  };
  k.make_local = [](const LocalStageOptions& o) { return std::make_unique<SpellStage>(o.name); };
  return k;
}

class EchoFamily : public ModelFamily {
 public:
  std::string name() const override { return "echo"; }
  const std::vector<StageKind>& stage_kinds() const override {
    static const std::vector<StageKind> kinds = {shout(), spell()};
    return kinds;
  }
  // echo_spell reads only the letters: the shout's metrics stay behind.
  const std::vector<Handoff>& handoffs() const override {
    static const std::vector<Handoff> handoffs = [] {
      Handoff h;
      h.name = "shout2spell";
      h.from = "echo_shout";
      h.to = "echo_spell";
      h.apply = [](StagePacket p) {
        p.metrics.clear();
        return p;
      };
      return std::vector<Handoff>{h};
    }();
    return handoffs;
  }
};

const RegisterModelFamily<EchoFamily> registered;

}  // namespace
}  // namespace omni::pipeline
