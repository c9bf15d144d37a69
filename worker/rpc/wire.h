// StagePacket <-> proto messages (proto/stage.proto), both ways bitwise exact.
//
// No message may exceed kMaxMessageBytes, whatever the model: a hidden-state hand-off of a big
// model is tens of MB, and raising gRPC's limit to fit the largest packet would only move the
// failure to the next larger model. So a packet whose payload exceeds kChunkBytes is split over
// several proto Packets (`more` on all but the last) and tensors over several Tensor chunks
// (offset / total_bytes); a PacketAssembler puts them back together and validates everything
// it is sent (a worker must not crash or allocate without bound on a malformed message).
//
// The chunk (1 MiB) is a quarter of the limit (4 MiB): the slack holds the small fields of a
// message (tensor names, shapes, tokens, metrics) without computing exact encoded sizes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "stage.pb.h"
#include "worker/pipeline/stage.h"

namespace omni::rpc {

// The message size limit of every channel and server (deliberate, see above).
constexpr size_t kMaxMessageBytes = 4 << 20;
// The payload bytes (tensor data, media data, text, tokens) one message carries at most.
constexpr size_t kChunkBytes = 1 << 20;

// What an assembler accepts at most, counted as the memory a received packet takes: tensor bytes,
// 8 bytes per token id, text bytes, each codec frame's codes plus kFrameOverheadBytes, and the
// fixed costs below. A peer that declares a 1 TB tensor, or sends token ids in a packet that never
// ends, gets an error, not an allocation: each message is checked before anything is appended.
//
// The largest real packets: the thinker's first hand-off, embeds and hidden rows of 2 x 2048
// values per prompt token (Qwen3-Omni 30B-A3B: 512 MiB for 64k tokens in bfloat16, 1 GiB in
// float32), and a video's frames, float32 [F, H, W, 3] (Wan2.2 A14B, 81 frames of 1280x720:
// 854 MiB; TI2V-5B, 121 of 1280x704: 1.22 GiB). 2 GiB per packet is 1.6x the largest of them.
struct WireLimits {
  uint64_t max_tensor_bytes = uint64_t{2} << 30;  // one tensor (or the audio chunk)
  uint64_t max_packet_bytes = uint64_t{2} << 30;  // one packet in memory, everything counted
  // Every packet one assembler takes in, together. No limit here: the orchestrator hands each
  // packet of a worker's answer on as it comes; a worker sets one for what a Run call's upstream
  // brings in (ServerOptions::max_upstream_bytes), since its stage may keep all of it.
  uint64_t max_request_bytes = std::numeric_limits<uint64_t>::max();
  uint64_t max_media_bytes = uint64_t{2} << 30;  // all media files of one request
  size_t max_dims = 16;
};

// The fixed memory costs an assembler counts besides the payload bytes (estimates that err high).
constexpr uint64_t kPacketOverheadBytes = sizeof(pipeline::StagePacket) + 64;  // + a queue slot
constexpr uint64_t kFrameOverheadBytes = sizeof(std::vector<int64_t>) + 16;    // + malloc header
constexpr uint64_t kTensorOverheadBytes = 512;  // at::Tensor's TensorImpl and StorageImpl
constexpr uint64_t kMetricOverheadBytes = 96;   // a std::map node beside its key's bytes

// Wire names of the supported dtypes: float32, float64, bfloat16, float16, int64, int32, uint8,
// bool. dtype_name throws StageError kInvalidArgument for any other; dtype_from_name returns
// nullopt for an unknown name.
const char* dtype_name(at::ScalarType type);
std::optional<at::ScalarType> dtype_from_name(const std::string& name);

// A stage's info as the Info call carries it: JSON, so that a new field needs no wire change.
// info_from_json throws StageError kInternal for text that is not a JSON object; a field it
// lacks keeps its default (device_weight_bytes: param_bytes, as a worker from before it meant).
std::string info_to_json(const pipeline::StageInfo& info);
pipeline::StageInfo info_from_json(const std::string& json);

// Splits `packet` into messages of at most `chunk_bytes` payload each and hands them to `emit`
// in order (one chunk in memory at a time, so a 10 GB tensor costs no 10 GB copy). Tensors are
// moved to the CPU and made contiguous first. Throws StageError kInvalidArgument naming the
// tensor for an unsupported dtype.
void split_packet(const pipeline::StagePacket& packet,
                  const std::function<void(proto::Packet&&)>& emit,
                  size_t chunk_bytes = kChunkBytes);
std::vector<proto::Packet> split_packet(const pipeline::StagePacket& packet,
                                        size_t chunk_bytes = kChunkBytes);

// Reassembles the messages of split_packet. Received tensors own their memory.
class PacketAssembler {
 public:
  explicit PacketAssembler(WireLimits limits = {});
  // Adds the next message; returns the packet when this message ends it (`more` unset).
  // Throws StageError kInvalidArgument naming the tensor for a malformed message (unknown
  // dtype, shape that disagrees with total_bytes, a chunk out of order), or naming what would
  // exceed which limit (WireLimits); the packet is then dropped.
  std::optional<pipeline::StagePacket> add(const proto::Packet& message);
  // A packet has begun and not ended.
  bool in_progress() const { return in_progress_; }
  // The memory the packet being assembled takes, and every packet taken in so far (as counted
  // against the limits).
  uint64_t packet_bytes() const { return packet_bytes_; }
  uint64_t request_bytes() const { return request_bytes_; }

 private:
  struct Partial {
    std::string name;  // as errors name it
    std::string wire_name;
    at::Tensor tensor;
    uint64_t received = 0, total = 0;
  };
  void add_chunk(const proto::Tensor& chunk, bool audio);
  // Counts `bytes` more against both limits, or throws naming `what` and the limit.
  void charge(const std::string& what, uint64_t bytes);
  void reset();

  WireLimits limits_;
  pipeline::StagePacket packet_;
  pipeline::NamedTensors payload_;  // the packet's payload tensors so far
  std::optional<Partial> open_tensor_, open_audio_;
  uint64_t packet_bytes_ = 0, request_bytes_ = 0;
  bool in_progress_ = false;
};

// Media files of a request. The header lists every file with its first chunk (offset 0 and
// total_bytes, so the receiver knows when all have arrived: no extra end marker is needed) and
// holds at most `chunk_bytes` of data in all; the rest follows as RunRequest.media chunks in
// file order.
void put_media_header(const std::vector<pipeline::MediaFile>& media, proto::RunHeader* header,
                      size_t chunk_bytes = kChunkBytes);
void split_media_rest(const std::vector<pipeline::MediaFile>& media, const proto::RunHeader& header,
                      const std::function<void(proto::MediaFile&&)>& emit,
                      size_t chunk_bytes = kChunkBytes);

// Reassembles the media of a request. Errors are StageError kInvalidArgument naming the file.
class MediaAssembler {
 public:
  explicit MediaAssembler(WireLimits limits = {});
  void add_header(const proto::RunHeader& header);
  void add(const proto::MediaFile& chunk);
  // Every file listed in the header has all its bytes.
  bool complete() const;
  std::vector<pipeline::MediaFile> take();

 private:
  void append(size_t index, const proto::MediaFile& chunk);

  WireLimits limits_;
  std::vector<pipeline::MediaFile> files_;
  std::vector<uint64_t> totals_;
  size_t next_ = 0;  // the first file not complete
  uint64_t total_bytes_ = 0;
};

// In-band errors (RunResponse.error).
proto::StageError to_proto(const pipeline::StageError& error);
pipeline::StageError from_proto(const proto::StageError& error);

}  // namespace omni::rpc
