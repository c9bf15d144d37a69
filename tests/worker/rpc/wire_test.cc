// StagePacket <-> proto: split, serialized, parsed and reassembled, bitwise equal; every message
// under the limit; malformed chunks refused with the tensor's name; the memory a packet takes
// counted against the limits to the byte.
#include "worker/rpc/wire.h"
#include "tests/worker/rpc/packet_tensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace omni::rpc {
namespace {

using pipeline::StageError;
using pipeline::StagePacket;

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() &&
         (ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

// Random bit patterns: NaNs, infinities and denormals too, which a value-level copy could alter.
at::Tensor random_bits(const std::vector<int64_t>& shape, at::ScalarType type) {
  const int64_t bytes = c10::elementSize(type);
  std::vector<int64_t> byte_shape = shape;
  byte_shape.push_back(bytes);
  at::Tensor raw = at::randint(0, 256, byte_shape, at::kByte);
  return raw.view(type).reshape(shape);
}

// What the transport does to a message.
proto::Packet through_wire(const proto::Packet& message) {
  proto::Packet parsed;
  EXPECT_TRUE(parsed.ParseFromString(message.SerializeAsString()));
  return parsed;
}

StagePacket round_trip(const StagePacket& packet, size_t* messages = nullptr) {
  std::vector<proto::Packet> parts = split_packet(packet);
  if (messages) *messages = parts.size();
  PacketAssembler assembler;
  std::optional<StagePacket> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LT(parts[i].ByteSizeLong(), kMaxMessageBytes) << "message " << i;
    EXPECT_EQ(parts[i].more(), i + 1 < parts.size()) << "message " << i;
    EXPECT_FALSE(out.has_value()) << "the packet ended early at message " << i;
    out = assembler.add(through_wire(parts[i]));
  }
  EXPECT_TRUE(out.has_value());
  EXPECT_FALSE(assembler.in_progress());
  return out ? std::move(*out) : StagePacket{};
}

StagePacket big_packet() {
  StagePacket p;
  for (int64_t i = 0; i < 300000; ++i) p.tokens.push_back(i * 7919 - 5);  // 3 MB of varints
  std::string text;
  while (text.size() < 3000000) text += "héllo wörld 世界 🎵 ";  // multibyte, over 1 MiB
  p.text = text;
  p.frames = {{1, 2, 3, 4}, {5, 6, 7, 8}, {-1, 0, 1 << 20, int64_t{1} << 40}};
  testing::add_tensor(p, "big", random_bits({2621440}, at::kFloat));  // 10 MiB
  testing::add_tensor(p, "bf16", random_bits({3, 1000, 7}, at::kBFloat16));
  testing::add_tensor(p, "ids",
                      at::randint(-(int64_t{1} << 60), int64_t{1} << 60, {513}, at::kLong));
  testing::add_tensor(p, "f16", random_bits({17, 3}, at::kHalf));
  testing::add_tensor(p, "f64", random_bits({5}, at::kDouble));
  testing::add_tensor(p, "i32", random_bits({4, 4}, at::kInt));
  testing::add_tensor(p, "u8", random_bits({9}, at::kByte));
  testing::add_tensor(p, "mask", at::rand({33}) > 0.5);
  testing::add_tensor(p, "empty", at::empty({0, 4}, at::kFloat));
  testing::add_tensor(p, "scalar", at::scalar_tensor(3.5, at::kFloat));
  testing::add_tensor(p, "none", at::Tensor());
  p.audio = random_bits({800000}, at::kFloat);  // 3.2 MB
  p.finished = true;
  p.finish_reason = "stop";
  p.metrics = {{"decode_ms", 12.5}, {"tokens", 300000}};
  p.source = 0;  // stage 0: an id the wire must tell from "none"
  return p;
}

void expect_same(const StagePacket& a, const StagePacket& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.frames, b.frames);
  ASSERT_EQ(testing::tensors_of(a).size(), testing::tensors_of(b).size());
  for (size_t i = 0; i < testing::tensors_of(a).size(); ++i) {
    EXPECT_EQ(testing::tensors_of(a)[i].first, testing::tensors_of(b)[i].first);
    EXPECT_TRUE(bitwise_equal(testing::tensors_of(a)[i].second, testing::tensors_of(b)[i].second))
        << "tensor " << testing::tensors_of(a)[i].first;
  }
  EXPECT_TRUE(bitwise_equal(a.audio, b.audio));
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  EXPECT_EQ(a.metrics, b.metrics);
  EXPECT_EQ(a.source, b.source);
}

TEST(WireTest, BigPacketRoundTripIsBitwiseExact) {
  const StagePacket packet = big_packet();
  size_t messages = 0;
  const StagePacket out = round_trip(packet, &messages);
  expect_same(packet, out);
  // 10 MiB + 3.2 MB + 3 MB of text + 3 MB of tokens in 1 MiB chunks.
  EXPECT_GE(messages, 19u);
  // Received tensors own their memory: the sender's may go away.
  EXPECT_NE(out.tensor("big").data_ptr(), packet.tensor("big").data_ptr());
}

TEST(WireTest, SmallPacketIsOneMessage) {
  StagePacket packet;
  packet.tokens = {1, 2, 3};
  packet.text = "hi";
  testing::add_tensor(packet, "rows", at::arange(12, at::kFloat).reshape({3, 4}));
  const std::vector<proto::Packet> parts = split_packet(packet);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_FALSE(parts[0].more());
  expect_same(packet, round_trip(packet));
}

TEST(WireTest, NonContiguousTensorsArriveContiguousWithTheSameValues) {
  StagePacket packet;
  const at::Tensor t = at::arange(20, at::kFloat).reshape({4, 5}).t();
  testing::add_tensor(packet, "t", t);
  const StagePacket out = round_trip(packet);
  EXPECT_TRUE(out.tensor("t").is_contiguous());
  EXPECT_TRUE(at::equal(out.tensor("t"), t));
}

TEST(WireTest, UnsupportedDtypeIsRefusedNamingTheTensor) {
  StagePacket packet;
  testing::add_tensor(packet, "cplx", at::zeros({2}, at::kComplexFloat));
  try {
    split_packet(packet);
    FAIL() << "no error";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("tensor 'cplx'"), std::string::npos) << e.what();
  }
}

// The messages of a packet holding one 3 MiB float32 tensor "x" (three chunks).
std::vector<proto::Packet> three_chunks() {
  StagePacket packet;
  testing::add_tensor(packet, "x", random_bits({786432}, at::kFloat));
  std::vector<proto::Packet> parts = split_packet(packet);
  EXPECT_EQ(parts.size(), 3u);
  return parts;
}

void expect_refused(const std::vector<proto::Packet>& parts, const std::string& what,
                    WireLimits limits = {}) {
  PacketAssembler assembler(limits);
  try {
    for (const auto& part : parts) assembler.add(part);
    FAIL() << "accepted: " << what;
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  EXPECT_FALSE(assembler.in_progress());  // reset after the error
}

TEST(WireTest, MalformedChunksAreRefusedNamingTheTensor) {
  {
    auto parts = three_chunks();
    parts.erase(parts.begin() + 1);  // a gap
    expect_refused(parts, "expected");
  }
  {
    auto parts = three_chunks();
    parts[0].mutable_tensors(0)->set_total_bytes(12345);  // wrong total
    expect_refused(parts, "total_bytes");
  }
  {
    auto parts = three_chunks();
    parts[1].mutable_tensors(0)->set_total_bytes(12345);  // total changes between chunks
    expect_refused(parts, "total_bytes");
  }
  {
    auto parts = three_chunks();
    parts[0].mutable_tensors(0)->set_dtype("complex64");
    expect_refused(parts, "unknown dtype 'complex64'");
  }
  {
    auto parts = three_chunks();
    parts[0].mutable_tensors(0)->set_shape(0, 7);  // shape disagrees with the bytes
    expect_refused(parts, "shape [7]");
  }
  {
    auto parts = three_chunks();
    parts[0].mutable_tensors(0)->set_shape(0, -1);
    expect_refused(parts, "negative");
  }
  {
    auto parts = three_chunks();
    parts.pop_back();  // the packet ends before the tensor does
    parts.back().set_more(false);
    expect_refused(parts, "incomplete");
  }
  {
    auto parts = three_chunks();
    std::swap(parts[1], parts[2]);  // out of order
    parts[1].set_more(true);
    parts[2].set_more(false);
    expect_refused(parts, "expected");
  }
  {
    auto parts = three_chunks();
    parts[2].mutable_tensors(0)->mutable_data()->append("extra");  // runs past the end
    expect_refused(parts, "past total_bytes");
  }
  {
    WireLimits limits;
    limits.max_tensor_bytes = 1 << 20;
    expect_refused(three_chunks(), "exceed the limit", limits);
  }
  {
    auto parts = three_chunks();  // a 2^62-element shape: no allocation attempt, an error
    auto* t = parts[0].mutable_tensors(0);
    t->clear_shape();
    t->add_shape(int64_t{1} << 62);
    t->add_shape(1 << 20);
    expect_refused(parts, "too large");
  }
}

// The memory a received packet takes as wire.h counts it: each payload in the container it lands
// in, plus the fixed costs.
uint64_t memory_cost(const StagePacket& p) {
  uint64_t bytes = kPacketOverheadBytes + 8 * p.tokens.size() + p.text.size();
  for (const auto& frame : p.frames) bytes += kFrameOverheadBytes + 8 * frame.size();
  for (const auto& [name, t] : testing::tensors_of(p)) {
    bytes += kTensorOverheadBytes + name.size() + (t.defined() ? t.nbytes() : 0);
  }
  if (p.audio.defined()) bytes += kTensorOverheadBytes + p.audio.nbytes();
  bytes += p.finish_reason.size();
  for (const auto& [key, value] : p.metrics) bytes += kMetricOverheadBytes + key.size();
  return bytes;
}

// Assembles `packet` from messages of at most 4096 payload bytes (so that it spans several)
// under `limits`: "" when it arrives whole, else the error.
std::string assembly_error(const StagePacket& packet, const WireLimits& limits) {
  PacketAssembler assembler(limits);
  const std::vector<proto::Packet> parts = split_packet(packet, 4096);
  try {
    std::optional<StagePacket> out;
    for (const auto& part : parts) out = assembler.add(through_wire(part));
    EXPECT_TRUE(out.has_value());
    EXPECT_EQ(assembler.request_bytes(), memory_cost(packet));
    return "";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument) << e.what();
    EXPECT_FALSE(assembler.in_progress());
    EXPECT_EQ(assembler.request_bytes(), 0u) << "the dropped packet is still counted";
    return e.what();
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Token ids, text, codec frames, tensors and the last message's fields all count toward the
// packet's limit with the bytes they take in memory: a packet at the limit arrives, a limit one
// byte lower refuses it naming what overflowed and the limit.
TEST(WireTest, EveryPartOfAPacketCountsTowardItsLimitToTheByte) {
  StagePacket tokens;
  tokens.tokens.assign(3000, 7);  // 24 KB in memory from 3 KB of varints
  StagePacket text;
  text.text = std::string(10000, 'a');
  StagePacket frames;
  frames.frames.assign(500, std::vector<int64_t>(16, 3));
  StagePacket tensors;
  testing::add_tensor(tensors, "none", at::Tensor());
  testing::add_tensor(tensors, "rows", at::ones({300, 8}, at::kFloat));  // the last one counted
  StagePacket last;
  last.finish_reason = "stop";
  last.metrics = {{"decode_ms", 1.5}, {"tokens", 3}};
  const std::vector<std::pair<StagePacket, std::string>> cases = {
      {tokens, "token ids"},
      {text, "text"},
      {frames, "codec frames"},
      {tensors, "tensor 'rows'"},
      {last, "finish reason and metrics"}};
  for (const auto& [packet, what] : cases) {
    SCOPED_TRACE(what);
    const uint64_t cost = memory_cost(packet);
    WireLimits limits;
    limits.max_packet_bytes = cost;
    EXPECT_EQ(assembly_error(packet, limits), "");
    limits.max_packet_bytes = cost - 1;
    const std::string error = assembly_error(packet, limits);
    EXPECT_TRUE(contains(error, what + ": ")) << error;
    EXPECT_TRUE(contains(error, "packet's limit of " + std::to_string(cost - 1) + " bytes"))
        << error;
  }
  // All at once, and one byte of text more than the limit holds.
  StagePacket all = big_packet();
  const uint64_t cost = memory_cost(all);
  WireLimits limits;
  limits.max_packet_bytes = cost;
  EXPECT_EQ(assembly_error(all, limits), "");
  all.text += "!";
  const std::string error = assembly_error(all, limits);
  EXPECT_TRUE(contains(error, "packet's limit of " + std::to_string(cost))) << error;
}

// What a hostile client sends: one packet whose `more` never ends. Each message holds 128 Ki
// token ids of one varint byte (128 KiB on the wire, 1 MiB in memory); the fourth would take the
// packet past 4 MiB.
TEST(WireTest, APacketThatNeverEndsIsRefusedAtItsLimit) {
  proto::Packet part;
  part.set_more(true);
  for (int i = 0; i < (1 << 17); ++i) part.add_token_ids(1);
  WireLimits limits;
  limits.max_packet_bytes = 4 << 20;
  PacketAssembler assembler(limits);
  int accepted = 0;
  try {
    for (; accepted < 100; ++accepted) assembler.add(part);
    FAIL() << "100 MiB of token ids were accepted";
  } catch (const StageError& e) {
    EXPECT_TRUE(contains(e.what(), "token ids: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), std::to_string(4 << 20))) << e.what();
  }
  EXPECT_EQ(accepted, 3);
  EXPECT_FALSE(assembler.in_progress());
  EXPECT_EQ(assembler.packet_bytes(), 0u);
}

// The packets one assembler takes in (one Run call's upstream) stay under the request's limit
// together; a packet refused for it leaves the count where it was.
TEST(WireTest, TheRequestsPacketsStayUnderItsLimitTogether) {
  StagePacket p;
  p.tokens = {1, 2, 3};
  p.text = "row";
  testing::add_tensor(p, "hidden", at::zeros({1, 16}, at::kFloat));
  const uint64_t cost = memory_cost(p);
  WireLimits limits;
  limits.max_request_bytes = 3 * cost;
  PacketAssembler assembler(limits);
  const std::vector<proto::Packet> parts = split_packet(p);
  ASSERT_EQ(parts.size(), 1u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(assembler.add(parts[0]).has_value()) << i;
  EXPECT_EQ(assembler.request_bytes(), 3 * cost);
  try {
    assembler.add(parts[0]);
    FAIL() << "a fourth packet was accepted";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
    EXPECT_TRUE(contains(e.what(), "limit of " + std::to_string(3 * cost) +
                                       " bytes for all upstream packets of a request"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "--max-upstream-bytes")) << e.what();
  }
  EXPECT_EQ(assembler.request_bytes(), 3 * cost);
}

TEST(WireTest, MediaRoundTripIsBitwiseExact) {
  std::vector<pipeline::MediaFile> media(3);
  media[0] = {"image", "a.png", std::string("\x89PNG\r\n\x1a\n", 8) + std::string(1000, '\0')};
  media[1].kind = "audio";
  media[1].name = "b.wav";
  for (int i = 0; i < 2500000; ++i) media[1].data.push_back(static_cast<char>(i * 31 % 251));
  media[2] = {"audio", "empty.wav", ""};

  proto::RunRequest first;
  put_media_header(media, first.mutable_header());
  EXPECT_TRUE(first.header().media_more());
  EXPECT_LT(first.ByteSizeLong(), kMaxMessageBytes);
  std::vector<proto::RunRequest> rest;
  split_media_rest(media, first.header(), [&](proto::MediaFile&& chunk) {
    rest.emplace_back();
    *rest.back().mutable_media() = std::move(chunk);
    EXPECT_LT(rest.back().ByteSizeLong(), kMaxMessageBytes);
  });
  EXPECT_EQ(rest.size(), 2u);  // 2.5 MB: 1 MiB in the header, then two chunks

  MediaAssembler assembler;
  assembler.add_header(first.header());
  EXPECT_FALSE(assembler.complete());
  for (const auto& r : rest) assembler.add(r.media());
  ASSERT_TRUE(assembler.complete());
  const std::vector<pipeline::MediaFile> out = assembler.take();
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].kind, media[i].kind);
    EXPECT_EQ(out[i].name, media[i].name);
    EXPECT_TRUE(out[i].data == media[i].data) << media[i].name;
  }

  MediaAssembler gap;
  gap.add_header(first.header());
  try {
    gap.add(rest[1].media());
    FAIL() << "a gap was accepted";
  } catch (const StageError& e) {
    EXPECT_EQ(e.code(), StageError::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'b.wav'"), std::string::npos) << e.what();
  }
}

TEST(WireTest, ErrorsRoundTrip) {
  using Code = StageError::Code;
  for (const Code code : {Code::kInternal, Code::kInvalidArgument, Code::kCancelled,
                          Code::kDeadlineExceeded, Code::kUnavailable, Code::kResourceExhausted}) {
    const StageError error(code, "stage 2 (code2wav)", "too slow");
    const StageError back = from_proto(to_proto(error));
    EXPECT_EQ(back.code(), error.code()) << static_cast<int>(code);
    EXPECT_EQ(back.stage(), error.stage());
    EXPECT_EQ(back.message(), error.message());
  }
}

}  // namespace
}  // namespace omni::rpc
