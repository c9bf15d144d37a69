#include "worker/qwen3_omni/stage_params.h"

#include <nlohmann/json.hpp>

#include "worker/pipeline/stage.h"

namespace omni::pipeline {
namespace {

using Json = nlohmann::json;

Json sampling_json(const models::SamplingParams& p) {
  return Json{{"temperature", p.temperature},
              {"top_k", p.top_k},
              {"top_p", p.top_p},
              {"seed", p.seed},
              {"greedy", p.greedy},
              {"repetition_penalty", p.repetition_penalty},
              {"suppress_tokens", p.suppress_tokens},
              {"max_new_tokens", p.max_new_tokens},
              {"stop_token_ids", p.stop_token_ids}};
}

models::SamplingParams sampling_from(const Json& j) {
  models::SamplingParams p;
  p.temperature = j.at("temperature").get<double>();
  p.top_k = j.at("top_k").get<int64_t>();
  p.top_p = j.at("top_p").get<double>();
  p.seed = j.at("seed").get<uint64_t>();
  p.greedy = j.at("greedy").get<bool>();
  p.repetition_penalty = j.at("repetition_penalty").get<double>();
  p.suppress_tokens = j.at("suppress_tokens").get<std::vector<int64_t>>();
  p.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
  p.stop_token_ids = j.at("stop_token_ids").get<std::vector<int64_t>>();
  return p;
}

// A turn's parts: {"type": "text", "text": ...}, {"type": "audio"} or {"type": "image"}.
Json parts_json(const std::vector<models::ChatPart>& parts) {
  Json out = Json::array();
  for (const auto& part : parts) {
    switch (part.kind) {
      case models::ChatPart::Kind::kText:
        out.push_back({{"type", "text"}, {"text", part.text}});
        break;
      case models::ChatPart::Kind::kAudio:
        out.push_back({{"type", "audio"}});
        break;
      case models::ChatPart::Kind::kImage:
        out.push_back({{"type", "image"}});
        break;
    }
  }
  return out;
}

std::vector<models::ChatPart> parts_from(const Json& j) {
  std::vector<models::ChatPart> parts;
  for (const auto& item : j) {
    const std::string type = item.at("type").get<std::string>();
    models::ChatPart part;
    if (type == "text") {
      part.text = item.at("text").get<std::string>();
    } else if (type == "audio" || type == "image") {
      part.kind = type == "audio" ? models::ChatPart::Kind::kAudio : models::ChatPart::Kind::kImage;
    } else {
      throw StageError(StageError::Code::kInvalidArgument, "",
                       "malformed thinker parameters: unknown part type '" + type + "'");
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

// Parses with every JSON error turned into a StageError that says which parameters.
template <typename Fn>
auto parse(const char* what, const std::string& text, Fn&& fn) {
  try {
    return fn(Json::parse(text));
  } catch (const Json::exception& e) {
    throw StageError(StageError::Code::kInvalidArgument, "",
                     std::string("malformed ") + what + " parameters: " + e.what());
  }
}

}  // namespace

std::string ThinkerParams::to_json() const {
  const ThinkerParams& p = *this;
  Json turns = Json::array();
  for (const auto& t : p.history) {
    turns.push_back({{"role", t.role}, {"parts", parts_json(t.parts)}});
  }
  return Json{{"text", p.text},
              {"parts", parts_json(p.parts)},
              {"system_prompt", p.system_prompt},
              {"history", std::move(turns)},
              {"sampling", sampling_json(p.sampling)},
              {"handoff", p.handoff},
              {"stop", p.stop}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string TalkerParams::to_json() const {
  const TalkerParams& p = *this;
  return Json{{"speaker", p.speaker},
              {"talker", sampling_json(p.talker)},
              {"code_predictor", sampling_json(p.code_predictor)},
              {"max_frames", p.max_frames}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Code2WavParams::to_json() const {
  const Code2WavParams& p = *this;
  return Json{{"stream_audio", p.stream_audio},
              {"first_chunk_frames", p.stream.first_chunk_frames},
              {"chunk_frames", p.stream.chunk_frames},
              {"left_context_frames", p.stream.left_context_frames},
              {"waveform", p.waveform}}
      .dump();
}

ThinkerParams thinker_params(const std::string& json) {
  return parse("thinker", json, [](const Json& j) {
    ThinkerParams p;
    p.text = j.at("text").get<std::string>();
    p.system_prompt = j.at("system_prompt").get<std::string>();
    for (const auto& t : j.value("history", Json::array())) {
      models::ChatTurn turn;
      turn.role = t.at("role").get<std::string>();
      turn.parts = parts_from(t.at("parts"));
      p.history.push_back(std::move(turn));
    }
    p.parts = parts_from(j.value("parts", Json::array()));
    p.sampling = sampling_from(j.at("sampling"));
    p.handoff = j.at("handoff").get<bool>();
    p.stop = j.value("stop", std::vector<std::string>{});
    return p;
  });
}

TalkerParams talker_params(const std::string& json) {
  return parse("talker", json, [](const Json& j) {
    TalkerParams p;
    p.speaker = j.at("speaker").get<std::string>();
    p.talker = sampling_from(j.at("talker"));
    p.code_predictor = sampling_from(j.at("code_predictor"));
    p.max_frames = j.at("max_frames").get<int64_t>();
    return p;
  });
}

Code2WavParams code2wav_params(const std::string& json) {
  return parse("code2wav", json, [](const Json& j) {
    Code2WavParams p;
    p.stream_audio = j.at("stream_audio").get<bool>();
    p.stream.first_chunk_frames = j.at("first_chunk_frames").get<int64_t>();
    p.stream.chunk_frames = j.at("chunk_frames").get<int64_t>();
    p.stream.left_context_frames = j.at("left_context_frames").get<int64_t>();
    p.waveform = j.at("waveform").get<bool>();
    return p;
  });
}

std::string talker_facts_json(const TalkerFacts& facts) {
  return Json{{"num_code_groups", facts.num_code_groups}}.dump();
}

TalkerFacts talker_facts(const std::string& json) {
  if (json.empty()) return {};
  return parse("talker info", json, [](const Json& j) {
    TalkerFacts f;
    f.num_code_groups = j.at("num_code_groups").get<int64_t>();
    return f;
  });
}

}  // namespace omni::pipeline
