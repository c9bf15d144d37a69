#include "worker/rpc/wire.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

namespace omni::rpc {
namespace {

using pipeline::StageError;
using Code = StageError::Code;

// A tensor that is not there (StagePacket::tensor's "none"), distinct from an empty tensor.
constexpr const char* kUndefined = "undefined";
// A varint takes at most 10 bytes: the budget a token or a code costs in a message.
constexpr size_t kVarintBytes = 10;
// A chunk smaller than this is not worth a message of its own: start the next message instead.
constexpr size_t kMinChunk = 4096;

[[noreturn]] void invalid(const std::string& what) {
  throw StageError(Code::kInvalidArgument, "", what);
}

std::string shape_text(const proto::Tensor& t) {
  std::ostringstream out;
  out << "[";
  for (int i = 0; i < t.shape_size(); ++i) out << (i ? ", " : "") << t.shape(i);
  out << "]";
  return out.str();
}

// Fills one message at a time and hands it on when its payload budget is spent.
class Splitter {
 public:
  Splitter(const std::function<void(proto::Packet&&)>& emit, size_t chunk_bytes)
      : emit_(emit), chunk_(std::max<size_t>(chunk_bytes, kMinChunk)) {}

  size_t room() const { return chunk_ - std::min(used_, chunk_); }
  bool empty() const { return used_ == 0; }
  void use(size_t bytes) { used_ += bytes; }
  proto::Packet& message() { return message_; }
  // Sends the current message (a `more` one) and starts the next.
  void flush() {
    message_.set_more(true);
    emit_(std::move(message_));
    message_.Clear();
    used_ = 0;
  }
  void finish() {
    message_.set_more(false);
    emit_(std::move(message_));
  }

  // Text is split on UTF-8 character boundaries: a proto3 string must be valid UTF-8 in every
  // message, or the receiver's parser rejects it.
  void add_text(const std::string& text) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = std::min(room(), text.size() - pos);
      while (n > 0 && pos + n < text.size() && (static_cast<uint8_t>(text[pos + n]) & 0xC0) == 0x80)
        --n;
      if (n == 0) {
        flush();
        continue;
      }
      message_.mutable_text_delta()->append(text, pos, n);
      use(n);
      pos += n;
    }
  }

  void add_tensor(const std::string& name, const at::Tensor& tensor, bool audio) {
    const std::string label = audio ? std::string("audio") : "tensor '" + name + "'";
    if (!tensor.defined()) {
      proto::Tensor* t = start_entry(audio, 0);
      t->set_name(name);
      t->set_dtype(kUndefined);
      return;
    }
    std::string dtype;
    try {
      dtype = dtype_name(tensor.scalar_type());
    } catch (const StageError& e) {
      invalid(label + ": " + e.message());
    }
    const at::Tensor cpu = tensor.to(at::kCPU).contiguous();
    const uint64_t total = cpu.nbytes();
    const char* data = total ? static_cast<const char*>(cpu.data_ptr()) : nullptr;
    uint64_t offset = 0;
    do {
      const uint64_t remaining = total - offset;
      proto::Tensor* t = start_entry(audio, remaining);
      const uint64_t n = std::min<uint64_t>(room(), remaining);
      t->set_name(name);
      t->set_dtype(dtype);
      for (int64_t d : cpu.sizes()) t->add_shape(d);
      t->set_offset(offset);
      t->set_total_bytes(total);
      if (n) t->set_data(data + offset, n);
      use(n + name.size() + kVarintBytes * (cpu.dim() + 3));
      offset += n;
    } while (offset < total);
  }

 private:
  // A new Tensor entry in the current message, or in the next one when this one has too little
  // room left for the `remaining` bytes (or already holds an audio chunk: the field is single).
  proto::Tensor* start_entry(bool audio, uint64_t remaining) {
    if (used_ > 0 && (room() < std::min<uint64_t>(remaining, kMinChunk) || room() == 0 ||
                      (audio && message_.has_audio()))) {
      flush();
    }
    return audio ? message_.mutable_audio() : message_.add_tensors();
  }

  const std::function<void(proto::Packet&&)>& emit_;
  const size_t chunk_;
  proto::Packet message_;
  size_t used_ = 0;
};

}  // namespace

const char* dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      break;
  }
  invalid(std::string("dtype ") + c10::toString(type) + " cannot be sent (supported: float32, " +
          "float64, bfloat16, float16, int64, int32, uint8, bool)");
}

std::optional<at::ScalarType> dtype_from_name(const std::string& name) {
  static const std::pair<const char*, at::ScalarType> kTypes[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"bfloat16", at::kBFloat16},
      {"float16", at::kHalf},  {"int64", at::kLong},     {"int32", at::kInt},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  for (const auto& [n, type] : kTypes) {
    if (name == n) return type;
  }
  return std::nullopt;
}

void split_packet(const pipeline::StagePacket& packet,
                  const std::function<void(proto::Packet&&)>& emit, size_t chunk_bytes) {
  Splitter out(emit, chunk_bytes);
  for (int64_t token : packet.tokens) {
    if (out.room() < kVarintBytes) out.flush();
    out.message().add_token_ids(token);
    out.use(kVarintBytes);
  }
  out.add_text(packet.text);
  for (const auto& frame : packet.frames) {
    const size_t cost = kVarintBytes * (frame.size() + 1);
    if (out.room() < cost && !out.empty()) out.flush();  // a frame over the budget goes alone
    out.message().add_frames()->mutable_codes()->Add(frame.begin(), frame.end());
    out.use(cost);
  }
  if (packet.payload) {
    // A payload's tensors may be on a device in the producer's process: the wire takes bytes.
    for (const auto& [name, tensor] : packet.payload->tensors()) {
      out.add_tensor(name, tensor.defined() ? tensor.cpu() : tensor, false);
    }
  }
  if (packet.audio.defined()) out.add_tensor("", packet.audio, true);
  proto::Packet& last = out.message();
  last.set_finished(packet.finished);
  last.set_finish_reason(packet.finish_reason);
  if (packet.source >= 0) last.set_source_stage(packet.source);
  for (const auto& [key, value] : packet.metrics) (*last.mutable_metrics())[key] = value;
  out.finish();
}

std::vector<proto::Packet> split_packet(const pipeline::StagePacket& packet, size_t chunk_bytes) {
  std::vector<proto::Packet> messages;
  split_packet(
      packet, [&](proto::Packet&& m) { messages.push_back(std::move(m)); }, chunk_bytes);
  return messages;
}

// --- PacketAssembler -------------------------------------------------------------------------

PacketAssembler::PacketAssembler(WireLimits limits) : limits_(limits) {}

void PacketAssembler::reset() {
  packet_ = pipeline::StagePacket{};
  payload_.clear();
  open_tensor_.reset();
  open_audio_.reset();
  packet_bytes_ = 0;  // request_bytes_ stays: the packets handed on may still be held
  in_progress_ = false;
}

void PacketAssembler::charge(const std::string& what, uint64_t bytes) {
  // Subtractions, not sums: the counts never exceed their limits, so nothing can wrap around.
  if (bytes > limits_.max_packet_bytes - packet_bytes_) {
    invalid(what + ": " + std::to_string(bytes) + " more bytes in memory would exceed the " +
            "packet's limit of " + std::to_string(limits_.max_packet_bytes) + " bytes (" +
            std::to_string(packet_bytes_) + " taken)");
  }
  if (bytes > limits_.max_request_bytes - request_bytes_) {
    invalid(what + ": " + std::to_string(bytes) + " more bytes in memory would exceed the " +
            "limit of " + std::to_string(limits_.max_request_bytes) +
            " bytes for all upstream packets of a request (" + std::to_string(request_bytes_) +
            " taken; vllm-omni worker --max-upstream-bytes raises it)");
  }
  packet_bytes_ += bytes;
  request_bytes_ += bytes;
}

std::optional<pipeline::StagePacket> PacketAssembler::add(const proto::Packet& message) {
  try {
    // Each part is charged before it is appended: a refused message allocates nothing.
    if (!in_progress_) {
      in_progress_ = true;
      charge("a packet", kPacketOverheadBytes);
    }
    charge("token ids", uint64_t{sizeof(int64_t)} * message.token_ids_size());
    packet_.tokens.insert(packet_.tokens.end(), message.token_ids().begin(),
                          message.token_ids().end());
    charge("text", message.text_delta().size());
    packet_.text += message.text_delta();
    uint64_t frame_bytes = 0;
    for (const auto& frame : message.frames()) {
      frame_bytes += kFrameOverheadBytes + uint64_t{sizeof(int64_t)} * frame.codes_size();
    }
    charge("codec frames", frame_bytes);
    for (const auto& frame : message.frames()) {
      packet_.frames.emplace_back(frame.codes().begin(), frame.codes().end());
    }
    for (const auto& chunk : message.tensors()) add_chunk(chunk, false);
    if (message.has_audio()) add_chunk(message.audio(), true);
    if (message.more()) return std::nullopt;

    for (const auto* open : {&open_tensor_, &open_audio_}) {
      if (*open) {
        invalid((*open)->name + " is incomplete: the packet ended after " +
                std::to_string((*open)->received) + " of " + std::to_string((*open)->total) +
                " bytes");
      }
    }
    uint64_t tail_bytes = message.finish_reason().size();
    for (const auto& [key, value] : message.metrics()) {
      tail_bytes += kMetricOverheadBytes + key.size();
    }
    charge("finish reason and metrics", tail_bytes);
    packet_.finished = message.finished();
    packet_.finish_reason = message.finish_reason();
    packet_.source = message.has_source_stage() ? message.source_stage() : -1;
    packet_.metrics.insert(message.metrics().begin(), message.metrics().end());
    if (!payload_.empty()) {
      packet_.payload = std::make_shared<const pipeline::WirePayload>(std::move(payload_));
    }
    pipeline::StagePacket done = std::move(packet_);
    reset();
    return done;
  } catch (...) {
    request_bytes_ -= packet_bytes_;  // the packet is dropped: its memory is free again
    reset();
    throw;
  }
}

void PacketAssembler::add_chunk(const proto::Tensor& chunk, bool audio) {
  std::optional<Partial>& open = audio ? open_audio_ : open_tensor_;
  const std::string label = audio ? std::string("audio") : "tensor '" + chunk.name() + "'";
  if (open && (chunk.name() != open->wire_name || chunk.offset() == 0)) {
    invalid(open->name + " is incomplete (" + std::to_string(open->received) + " of " +
            std::to_string(open->total) + " bytes) when " + label + " begins");
  }
  if (!open) {
    if (chunk.offset() != 0) {
      invalid(label + ": a chunk at offset " + std::to_string(chunk.offset()) +
              " without the chunks before it");
    }
    if (chunk.dtype() == kUndefined) {
      if (chunk.total_bytes() != 0 || !chunk.data().empty() || chunk.shape_size() != 0) {
        invalid(label + ": an undefined tensor with a shape or data");
      }
      charge(label, kTensorOverheadBytes + chunk.name().size());
      if (audio) {
        packet_.audio = at::Tensor();
      } else {
        payload_.emplace_back(chunk.name(), at::Tensor());
      }
      return;
    }
    const std::optional<at::ScalarType> type = dtype_from_name(chunk.dtype());
    if (!type) invalid(label + ": unknown dtype '" + chunk.dtype() + "'");
    if (static_cast<size_t>(chunk.shape_size()) > limits_.max_dims) {
      invalid(label + ": " + std::to_string(chunk.shape_size()) + " dimensions (at most " +
              std::to_string(limits_.max_dims) + ")");
    }
    // The byte count the shape implies, with overflow checks: the shape comes from the peer.
    uint64_t bytes = c10::elementSize(*type);
    for (int64_t d : chunk.shape()) {
      if (d < 0) invalid(label + ": negative dimension in shape " + shape_text(chunk));
      if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
        invalid(label + ": shape " + shape_text(chunk) + " is too large");
      }
      bytes *= static_cast<uint64_t>(d);
    }
    if (bytes != chunk.total_bytes()) {
      invalid(label + ": shape " + shape_text(chunk) + " of " + chunk.dtype() + " needs " +
              std::to_string(bytes) + " bytes but total_bytes is " +
              std::to_string(chunk.total_bytes()));
    }
    if (bytes > limits_.max_tensor_bytes) {
      invalid(label + ": " + std::to_string(bytes) + " bytes exceed the limit of " +
              std::to_string(limits_.max_tensor_bytes));
    }
    charge(label, kTensorOverheadBytes + chunk.name().size() + bytes);
    std::vector<int64_t> shape(chunk.shape().begin(), chunk.shape().end());
    open =
        Partial{label, chunk.name(), at::empty(shape, at::TensorOptions().dtype(*type)), 0, bytes};
  }
  if (chunk.offset() != open->received) {
    invalid(open->name + ": chunk at offset " + std::to_string(chunk.offset()) + ", expected " +
            std::to_string(open->received) + " (chunks must be contiguous and in order)");
  }
  if (chunk.total_bytes() != open->total) {
    invalid(open->name + ": total_bytes changed from " + std::to_string(open->total) + " to " +
            std::to_string(chunk.total_bytes()) + " between chunks");
  }
  const uint64_t n = chunk.data().size();
  if (n > open->total - open->received) {
    invalid(open->name + ": chunk [" + std::to_string(chunk.offset()) + ", " +
            std::to_string(chunk.offset() + n) + ") runs past total_bytes " +
            std::to_string(open->total));
  }
  if (n) {
    std::memcpy(static_cast<char*>(open->tensor.data_ptr()) + open->received, chunk.data().data(),
                n);
  }
  open->received += n;
  if (open->received == open->total) {
    if (audio) {
      packet_.audio = std::move(open->tensor);
    } else {
      payload_.emplace_back(open->wire_name, std::move(open->tensor));
    }
    open.reset();
  }
}

// --- media -----------------------------------------------------------------------------------

void put_media_header(const std::vector<pipeline::MediaFile>& media, proto::RunHeader* header,
                      size_t chunk_bytes) {
  size_t budget = std::max<size_t>(chunk_bytes, kMinChunk);
  bool more = false;
  for (const auto& file : media) {
    proto::MediaFile* m = header->add_media();
    m->set_kind(file.kind);
    m->set_name(file.name);
    m->set_offset(0);
    m->set_total_bytes(file.data.size());
    const size_t n = std::min(budget, file.data.size());
    m->set_data(file.data.data(), n);
    budget -= n;
    more = more || n < file.data.size();
  }
  header->set_media_more(more);
}

void split_media_rest(const std::vector<pipeline::MediaFile>& media, const proto::RunHeader& header,
                      const std::function<void(proto::MediaFile&&)>& emit, size_t chunk_bytes) {
  chunk_bytes = std::max<size_t>(chunk_bytes, kMinChunk);
  for (size_t i = 0; i < media.size(); ++i) {
    const std::string& data = media[i].data;
    size_t offset = static_cast<int>(i) < header.media_size() ? header.media(i).data().size() : 0;
    while (offset < data.size()) {
      const size_t n = std::min(chunk_bytes, data.size() - offset);
      proto::MediaFile m;
      m.set_kind(media[i].kind);
      m.set_name(media[i].name);
      m.set_offset(offset);
      m.set_total_bytes(data.size());
      m.set_data(data.data() + offset, n);
      emit(std::move(m));
      offset += n;
    }
  }
}

MediaAssembler::MediaAssembler(WireLimits limits) : limits_(limits) {}

void MediaAssembler::add_header(const proto::RunHeader& header) {
  for (const auto& chunk : header.media()) {
    const std::string label = "media file '" + chunk.name() + "'";
    if (chunk.offset() != 0) invalid(label + ": the header must hold its first chunk");
    // total_bytes_ <= the limit, so the sum cannot overflow once the first test passed.
    if (chunk.total_bytes() > limits_.max_media_bytes ||
        total_bytes_ + chunk.total_bytes() > limits_.max_media_bytes) {
      invalid(label + ": the request's media exceed the limit of " +
              std::to_string(limits_.max_media_bytes) + " bytes");
    }
    total_bytes_ += chunk.total_bytes();
    pipeline::MediaFile file;
    file.kind = chunk.kind();
    file.name = chunk.name();
    file.data.reserve(chunk.total_bytes());
    files_.push_back(std::move(file));
    totals_.push_back(chunk.total_bytes());
    append(files_.size() - 1, chunk);
  }
  while (next_ < files_.size() && files_[next_].data.size() == totals_[next_]) ++next_;
  if (!header.media_more() && !complete()) {
    invalid("media file '" + files_[next_].name + "' is incomplete but the header says no " +
            "more media follow");
  }
}

void MediaAssembler::add(const proto::MediaFile& chunk) {
  if (complete()) invalid("media file '" + chunk.name() + "': a chunk after all media arrived");
  if (chunk.name() != files_[next_].name) {
    invalid("media file '" + chunk.name() + "': a chunk while '" + files_[next_].name +
            "' is incomplete (chunks must come in file order)");
  }
  append(next_, chunk);
  while (next_ < files_.size() && files_[next_].data.size() == totals_[next_]) ++next_;
}

void MediaAssembler::append(size_t index, const proto::MediaFile& chunk) {
  pipeline::MediaFile& file = files_[index];
  const std::string label = "media file '" + file.name + "'";
  if (chunk.offset() != file.data.size()) {
    invalid(label + ": chunk at offset " + std::to_string(chunk.offset()) + ", expected " +
            std::to_string(file.data.size()));
  }
  if (chunk.total_bytes() != totals_[index]) {
    invalid(label + ": total_bytes changed between chunks");
  }
  if (chunk.data().size() > totals_[index] - file.data.size()) {
    invalid(label + ": a chunk runs past total_bytes " + std::to_string(totals_[index]));
  }
  file.data += chunk.data();
}

bool MediaAssembler::complete() const { return next_ >= files_.size(); }

std::vector<pipeline::MediaFile> MediaAssembler::take() { return std::move(files_); }

// --- errors ----------------------------------------------------------------------------------

proto::StageError to_proto(const pipeline::StageError& error) {
  proto::StageError out;
  switch (error.code()) {
    case Code::kInternal:
      out.set_code(proto::StageError::INTERNAL);
      break;
    case Code::kInvalidArgument:
      out.set_code(proto::StageError::INVALID_ARGUMENT);
      break;
    case Code::kCancelled:
      out.set_code(proto::StageError::CANCELLED);
      break;
    case Code::kDeadlineExceeded:
      out.set_code(proto::StageError::DEADLINE_EXCEEDED);
      break;
    case Code::kUnavailable:
      out.set_code(proto::StageError::UNAVAILABLE);
      break;
    case Code::kResourceExhausted:
      out.set_code(proto::StageError::RESOURCE_EXHAUSTED);
      break;
  }
  out.set_stage(error.stage());
  out.set_message(error.message());
  return out;
}

pipeline::StageError from_proto(const proto::StageError& error) {
  Code code = Code::kInternal;
  switch (error.code()) {
    case proto::StageError::INVALID_ARGUMENT:
      code = Code::kInvalidArgument;
      break;
    case proto::StageError::CANCELLED:
      code = Code::kCancelled;
      break;
    case proto::StageError::DEADLINE_EXCEEDED:
      code = Code::kDeadlineExceeded;
      break;
    case proto::StageError::UNAVAILABLE:
      code = Code::kUnavailable;
      break;
    case proto::StageError::RESOURCE_EXHAUSTED:
      code = Code::kResourceExhausted;
      break;
    default:
      break;
  }
  return StageError(code, error.stage(), error.message());
}

std::string info_to_json(const pipeline::StageInfo& info) {
  return nlohmann::json{{"model_stage", info.model_stage},
                        {"param_bytes", info.param_bytes},
                        {"offloadable_bytes", info.offloadable_bytes},
                        {"device_weight_bytes", info.device_weight_bytes},
                        {"device_kv_bytes", info.device_kv_bytes},
                        {"voices", info.voices},
                        {"default_voice", info.default_voice},
                        {"audio_sample_rate", info.audio_sample_rate},
                        {"family", info.family_json},
                        {"context_tokens", info.context_tokens},
                        {"max_prompt_bytes", info.max_prompt_bytes}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

pipeline::StageInfo info_from_json(const std::string& json) {
  using pipeline::StageError;
  const auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    throw StageError(StageError::Code::kInternal, "", "the worker's info is not a JSON object");
  }
  pipeline::StageInfo info;
  try {
    info.model_stage = j.value("model_stage", std::string());
    info.param_bytes = j.value("param_bytes", uint64_t{0});
    info.offloadable_bytes = j.value("offloadable_bytes", uint64_t{0});
    info.device_weight_bytes = j.value("device_weight_bytes", info.param_bytes);
    info.device_kv_bytes = j.value("device_kv_bytes", uint64_t{0});
    info.voices = j.value("voices", std::vector<std::string>{});
    info.default_voice = j.value("default_voice", std::string());
    info.audio_sample_rate = j.value("audio_sample_rate", int64_t{0});
    info.family_json = j.value("family", std::string());
    info.context_tokens = j.value("context_tokens", int64_t{0});
    info.max_prompt_bytes = j.value("max_prompt_bytes", uint64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw StageError(StageError::Code::kInternal, "",
                     std::string("the worker's info has a field of the wrong type: ") + e.what());
  }
  return info;
}

}  // namespace omni::rpc
