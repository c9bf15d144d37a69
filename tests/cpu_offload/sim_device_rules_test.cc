// The simulated device's strict mode enforces CUDA's ordering rules (sim_device_rules.h): each
// rule is broken on purpose and must be reported (or, for reads no rule sees, read poison),
// and the correct use of the engine and every backend reports nothing and stays bitwise exact.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "../common/manual_event.h"
#include "cpu_offload/check.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/weight_store.h"
#include "model_runner/diffusion/tiny_pipeline.h"

namespace omni::offload {
namespace {

using Kind = DeviceRuleViolation::Kind;

// Collects violations instead of aborting. Declare it before the engine: buffers may report
// when they die, after the engine.
class Recorder {
 public:
  DeviceRuleViolationHandler handler() {
    return [this](const DeviceRuleViolation& v) {
      std::lock_guard<std::mutex> lock(mutex_);
      seen_.push_back(v);
    };
  }
  std::vector<DeviceRuleViolation> seen() {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }
  std::vector<Kind> kinds() {
    std::vector<Kind> out;
    for (const auto& v : seen()) out.push_back(v.kind);
    return out;
  }
  std::string describe() {
    std::ostringstream os;
    for (const auto& v : seen()) os << "\n  " << to_string(v.kind) << ": " << v.message;
    return os.str();
  }

 private:
  std::mutex mutex_;
  std::vector<DeviceRuleViolation> seen_;
};

TransferEngineOptions strict(Recorder& recorder, double bandwidth = 0) {
  TransferEngineOptions o;
  o.sim_strict = true;
  o.sim_violation_handler = recorder.handler();
  o.sim_bandwidth_bytes_per_s = bandwidth;
  return o;
}

HostBuffer filled_host(TransferEngine& engine, size_t bytes, uint8_t seed) {
  HostBuffer h = engine.allocate_host(bytes, false);
  for (size_t i = 0; i < bytes; ++i) h.data()[i] = static_cast<uint8_t>(seed + i * 13 % 200);
  return h;
}

at::Tensor device_bytes(const DeviceBuffer& buffer, size_t offset, size_t bytes) {
  return buffer.bytes_tensor()
      .narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(bytes))
      .clone();
}

at::Tensor host_bytes(const HostBuffer& buffer) {
  return at::from_blob(buffer.data(), {static_cast<int64_t>(buffer.bytes())}, at::kByte).clone();
}

bool all_poison(const at::Tensor& bytes) { return bytes.eq(0xFF).all().item<bool>(); }

// ---- Rule 1: freeing a buffer while a copy into it is pending ----------------------------

TEST(SimDeviceRules, FreeingABufferWhileItsCopyRunsIsReportedAndDoesNotCrash) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder, /*bandwidth=*/50e6));  // 1 MB: 20 ms
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 1 << 20, 1);
  {
    DeviceBuffer dst = engine->allocate_device((1 << 20) + 512);
    engine->copy_async({CopyOp{src, 0, dst, 512, 1 << 20}}, {});
  }  // the last handle goes while the copy thread still writes into it
  const auto seen = recorder.seen();
  ASSERT_EQ(seen.size(), 1u) << recorder.describe();
  EXPECT_EQ(seen[0].kind, Kind::kFreedWhileCopyPending);
  EXPECT_EQ(seen[0].buffer_bytes, (1u << 20) + 512);
  EXPECT_EQ(seen[0].offset, 512u);
  EXPECT_EQ(seen[0].copy_id, 1u);
  EXPECT_NE(seen[0].message.find("freed while copy #1"), std::string::npos) << seen[0].message;
  // The engine un-counts the memory at the free (that is the bug being caught: it would be
  // reused), but keeps it alive for the copy, which ends normally.
  EXPECT_EQ(engine->memory_counter()->current(), 0u);
  engine->synchronize();
}

TEST(SimDeviceRules, FreeingAfterTheCopyEndedButUnobservedIsStillReported) {
  // On CUDA nobody knows a copy ended until they ask: freeing on the assumption is a race.
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 4096, 2);
  {
    DeviceBuffer dst = engine->allocate_device(4096);
    engine->copy_async({CopyOp{src, 0, dst, 0, 4096}}, {});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the copy thread is done
  }
  EXPECT_EQ(recorder.kinds(), std::vector<Kind>{Kind::kFreedWhileCopyPending});
}

TEST(SimDeviceRules, FreeingAfterAnyWayOfWaitingIsClean) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder, /*bandwidth=*/1e9));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 1 << 16, 3);
  const std::vector<std::function<void(const Event&)>> waits = {
      [&](const Event& e) { engine->compute_wait(e); },
      [&](const Event& e) { e.host_wait(); },
      [&](const Event&) { engine->synchronize(); },
      [&](const Event& e) {
        while (!e.ready()) std::this_thread::yield();  // a host that polled and saw it end
      },
      [&](const Event&) {
        // A later copy's event: the copy stream is FIFO, so this one has ended too.
        HostBuffer other = filled_host(*engine, 64, 4);
        DeviceBuffer elsewhere = engine->allocate_device(64);
        engine->compute_wait(engine->copy_async({CopyOp{other, 0, elsewhere, 0, 64}}, {}));
      },
  };
  for (size_t i = 0; i < waits.size(); ++i) {
    DeviceBuffer dst = engine->allocate_device(1 << 16);
    const Event done = engine->copy_async({CopyOp{src, 0, dst, 0, src.bytes()}}, {});
    waits[i](done);
    EXPECT_TRUE(at::equal(device_bytes(dst, 0, src.bytes()), host_bytes(src))) << "wait " << i;
  }
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

// ---- Reads before the wait: poison ---------------------------------------------------------

TEST(SimDeviceRules, AReadBeforeTheWaitReadsPoisonWhateverTheTiming) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 4096, 5);
  DeviceBuffer dst = engine->allocate_device(4096 + 128);
  dst.bytes_tensor().fill_(7);
  const Event done = engine->copy_async({CopyOp{src, 0, dst, 64, 4096}}, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // long done on the copy thread
  EXPECT_TRUE(all_poison(device_bytes(dst, 64, 4096)));
  // Bytes outside the copy are untouched.
  EXPECT_TRUE(device_bytes(dst, 0, 64).eq(7).all().item<bool>());
  EXPECT_TRUE(device_bytes(dst, 64 + 4096, 64).eq(7).all().item<bool>());
  // Poison is NaN in the float formats weights come in.
  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto as_float =
        dst.bytes_tensor().narrow(0, 64, 4096).view(dtype).to(at::kFloat);  // a weight view
    EXPECT_TRUE(as_float.isnan().all().item<bool>()) << dtype;
  }
  engine->compute_wait(done);
  EXPECT_TRUE(at::equal(device_bytes(dst, 64, 4096), host_bytes(src)));
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

TEST(SimDeviceRules, FreshDeviceMemoryReadsAsPoisonNotAsTheBufferFreedBefore) {
  // An evicted component reloaded into a new buffer often gets the same memory back: without
  // this, a read before the wait would see its old weights and compute the right thing.
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 1 << 16, 9);
  for (int i = 0; i < 3; ++i) {
    DeviceBuffer dst = engine->allocate_device(1 << 16);
    EXPECT_TRUE(all_poison(device_bytes(dst, 0, 1 << 16))) << i;
    engine->compute_wait(engine->copy_async({CopyOp{src, 0, dst, 0, src.bytes()}}, {}));
    EXPECT_TRUE(at::equal(device_bytes(dst, 0, src.bytes()), host_bytes(src))) << i;
  }
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

TEST(SimDeviceRules, WaitingForAnEarlierCopyDoesNotRevealALaterOneIntoTheSameRange) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer a = filled_host(*engine, 1024, 10);
  HostBuffer b = filled_host(*engine, 1024, 20);
  DeviceBuffer dst = engine->allocate_device(1024);
  const Event first = engine->copy_async({CopyOp{a, 0, dst, 0, 1024}}, {});
  const Event second = engine->copy_async({CopyOp{b, 0, dst, 0, 1024}}, {});
  first.host_wait();
  EXPECT_TRUE(all_poison(device_bytes(dst, 0, 1024))) << "the second copy is still pending";
  engine->compute_wait(second);
  EXPECT_TRUE(at::equal(device_bytes(dst, 0, 1024), host_bytes(b)));
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

TEST(SimDeviceRules, ACopyBehindACallersPendingEventDoesNotPoisonWhatThatComputeReads) {
  // A caller's own event stands for compute in flight that may read the destination: the
  // copy thread poisons only once it has waited for it.
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = filled_host(*engine, 256, 30);
  DeviceBuffer dst = engine->allocate_device(256);
  dst.bytes_tensor().zero_();
  auto compute = std::make_shared<omni::testing::ManualEvent>();
  const Event done = engine->copy_async({CopyOp{src, 0, dst, 0, 256}}, {Event(compute)});
  // Queued behind it, with nothing to wait for itself: it must not poison ahead either.
  DeviceBuffer other = engine->allocate_device(256);
  other.bytes_tensor().zero_();
  const Event next = engine->copy_async({CopyOp{src, 0, other, 0, 256}}, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dst.bytes_tensor().sum().item<int64_t>(), 0);
  EXPECT_EQ(other.bytes_tensor().sum().item<int64_t>(), 0);
  compute->fire();
  engine->compute_wait(done);
  engine->compute_wait(next);
  EXPECT_TRUE(at::equal(device_bytes(dst, 0, 256), host_bytes(src)));
  EXPECT_TRUE(at::equal(device_bytes(other, 0, 256), host_bytes(src)));
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

// ---- Rules 2 and 3: binds (compute reads) against copies ---------------------------------

// A unit of one float tensor [0, 1, ..., n): its parameter is what compute reads.
struct Weights {
  at::Tensor weight;
  std::unique_ptr<OffloadUnit> unit;
  Weights(TransferEngine& engine, int64_t n, float start = 0) {
    weight = at::arange(start, start + static_cast<float>(n), at::kFloat);
    unit = std::make_unique<OffloadUnit>(
        "w", std::vector<std::pair<std::string, at::Tensor>>{{"w", weight}}, engine, false);
  }
  at::Tensor expected(int64_t n, float start = 0) const {
    return at::arange(start, start + static_cast<float>(n), at::kFloat);
  }
};

TEST(SimDeviceRules, BindingBeforeWaitingIsReportedAndComputeReadsNaN) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Weights w(*engine, 256);
  DeviceBuffer slot = engine->allocate_device(w.unit->bytes());
  const Event loaded = engine->copy_async({w.unit->copy_to(slot, 0)}, {});
  w.unit->bind(slot, 0);  // forgot compute_wait(loaded)
  EXPECT_EQ(recorder.kinds(), std::vector<Kind>{Kind::kBoundBeforeCopyWaited});
  EXPECT_TRUE(w.weight.isnan().all().item<bool>());  // the forward computes garbage
  engine->compute_wait(loaded);
  EXPECT_TRUE(at::equal(w.weight, w.expected(256)));
  w.unit->unbind();
}

TEST(SimDeviceRules, CopyingIntoARangeStillBoundIsReported) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Weights a(*engine, 256), b(*engine, 256, 1000);
  DeviceBuffer slot = engine->allocate_device(a.unit->bytes());
  engine->compute_wait(engine->copy_async({a.unit->copy_to(slot, 0)}, {}));
  a.unit->bind(slot, 0);
  const Event after_forward = engine->record_compute();
  // Overwrites a's weights while they are bound (a forgot unbind / was still running).
  engine->compute_wait(engine->copy_async({b.unit->copy_to(slot, 0)}, {after_forward}));
  const auto seen = recorder.seen();
  ASSERT_EQ(seen.size(), 1u) << recorder.describe();
  EXPECT_EQ(seen[0].kind, Kind::kCopyIntoBoundRange);
  EXPECT_EQ(seen[0].copy_id, 2u);
  a.unit->unbind();
}

TEST(SimDeviceRules, ReusingASlotMustBeOrderedAfterTheComputeThatReadIt) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Weights a(*engine, 256), b(*engine, 256, 1000);
  DeviceBuffer slot = engine->allocate_device(a.unit->bytes());
  const Event before_bind = engine->record_compute();
  engine->compute_wait(engine->copy_async({a.unit->copy_to(slot, 0)}, {}));
  a.unit->bind(slot, 0);
  a.unit->unbind();
  // No event at all, then one recorded before the bind: neither covers a's forward.
  engine->compute_wait(engine->copy_async({b.unit->copy_to(slot, 0)}, {}));
  b.unit->bind(slot, 0);
  b.unit->unbind();
  engine->compute_wait(engine->copy_async({a.unit->copy_to(slot, 0)}, {before_bind}));
  EXPECT_EQ(recorder.kinds(), (std::vector<Kind>{Kind::kCopyNotOrderedAfterReaders,
                                                 Kind::kCopyNotOrderedAfterReaders}));
}

TEST(SimDeviceRules, TheCorrectSlotCycleReportsNothingAndReadsExactWeights) {
  // What a backend does: wait, bind, compute, record, unbind, copy the next unit after the
  // recorded event; a never-bound prefetch may be overwritten without one.
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder, /*bandwidth=*/2e9));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  Weights a(*engine, 4096), b(*engine, 4096, 5000);
  DeviceBuffer slot = engine->allocate_device(a.unit->bytes());
  Event released;  // nothing has read the slot yet
  for (int i = 0; i < 6; ++i) {
    Weights& w = i % 2 ? b : a;
    const Event loaded = engine->copy_async({w.unit->copy_to(slot, 0)}, {released});
    engine->compute_wait(loaded);
    w.unit->bind(slot, 0);
    EXPECT_TRUE(at::equal(w.weight, w.expected(4096, i % 2 ? 5000 : 0))) << i;
    released = engine->record_compute();
    w.unit->unbind();
  }
  engine->copy_async({a.unit->copy_to(slot, 0)}, {released});  // a prefetch never used
  engine->copy_async({b.unit->copy_to(slot, 0)}, {released});  // overwritten: never read
  engine->synchronize();
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
}

// ---- How violations surface, and the switch ----------------------------------------------

TEST(SimDeviceRulesDeathTest, WithoutAHandlerAViolationAbortsNamingTheBufferAndTheCopy) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        TransferEngineOptions o;
        o.sim_strict = true;
        auto engine = make_cpu_sim_engine(o);
        auto compute_scope = engine->enter_compute();  // compute calls need one
        HostBuffer src = engine->allocate_host(3000, false);
        DeviceBuffer dst = engine->allocate_device(3000);
        engine->copy_async({CopyOp{src, 0, dst, 0, 3000}}, {});
        dst = DeviceBuffer();
      },
      "OMNI_SIM_STRICT.*device buffer of 3000 bytes freed while copy #1");
}

TEST(SimDeviceRules, StrictModeFollowsTheOptionThenTheEnvironment) {
  const char* saved = std::getenv("OMNI_SIM_STRICT");
  const std::string restore = saved ? saved : "";
  TransferEngineOptions unset;
  setenv("OMNI_SIM_STRICT", "1", 1);
  EXPECT_TRUE(sim_strict_enabled(unset));
  setenv("OMNI_SIM_STRICT", "0", 1);
  EXPECT_FALSE(sim_strict_enabled(unset));
  setenv("OMNI_SIM_STRICT", "maybe", 1);
  EXPECT_THROW(sim_strict_enabled(unset), Error);
  unsetenv("OMNI_SIM_STRICT");
  EXPECT_FALSE(sim_strict_enabled(unset));  // relaxed unless asked
  TransferEngineOptions on;
  on.sim_strict = true;
  EXPECT_TRUE(sim_strict_enabled(on));
  EXPECT_NE(make_cpu_sim_engine(on)->describe().find("strict"), std::string::npos);
  if (saved) setenv("OMNI_SIM_STRICT", restore.c_str(), 1);
}

TEST(SimDeviceRules, RelaxedModeChecksNothingButACopyNoLongerHoldsItsBufferAlive) {
  TransferEngineOptions o;
  o.sim_strict = false;
  o.sim_bandwidth_bytes_per_s = 50e6;
  auto engine = make_cpu_sim_engine(o);
  auto compute_scope = engine->enter_compute();  // compute calls need one
  HostBuffer src = engine->allocate_host(1 << 20, false);
  {
    DeviceBuffer dst = engine->allocate_device(1 << 20);
    engine->copy_async({CopyOp{src, 0, dst, 0, 1 << 20}}, {});
  }
  // Counted as freed at once, like a CUDA free; the copy keeps the memory until it ends.
  EXPECT_EQ(engine->memory_counter()->current(), 0u);
  engine->synchronize();
}

// ---- The backends under strict mode --------------------------------------------------------

using models::GenerateOptions;
using models::TinyDiffusionConfig;
using models::TinyDiffusionPipeline;

TinyDiffusionConfig pipeline_config(bool two_transformers) {
  TinyDiffusionConfig c;
  c.seed = 7;
  c.two_transformers = two_transformers;
  return c;
}

GenerateOptions generate_options() {
  GenerateOptions o;
  o.steps = 3;
  o.guidance_scale = 3.0;
  o.seed = 11;
  return o;
}

at::Tensor generate(TinyDiffusionPipeline& pipe, c10::Device device) {
  return pipe.generate(models::example_prompt(2, 6, 64, 1), models::example_prompt(2, 6, 64, 2),
                       generate_options(), device);
}

const at::Tensor& plain_image(bool two_transformers) {
  static std::map<bool, at::Tensor> cache;
  auto it = cache.find(two_transformers);
  if (it != cache.end()) return it->second;
  TinyDiffusionPipeline pipe(pipeline_config(two_transformers));
  return cache.emplace(two_transformers, generate(pipe, c10::Device(c10::kCPU))).first->second;
}

struct StrictCase {
  std::string name;
  OffloadConfig config;
  bool two_transformers = false;
  double bandwidth = 0;
};

void PrintTo(const StrictCase& c, std::ostream* os) { *os << c.name; }

std::vector<StrictCase> strict_cases() {
  std::vector<StrictCase> out;
  out.push_back({"resident", OffloadConfig::for_strategy(Strategy::kNone)});
  out.push_back({"layerwise", OffloadConfig::for_strategy(Strategy::kLayerwise)});
  auto n3 = OffloadConfig::for_strategy(Strategy::kLayerwise);
  n3.num_gpu_layers = 3;
  out.push_back({"layerwise_n3_slow_link", n3, false, 50e6});
  auto phase = OffloadConfig::for_strategy(Strategy::kLayerwise);
  phase.granularity = Granularity::kPhase;
  out.push_back({"layerwise_phase_two_dits", phase, true});
  out.push_back({"model_level", OffloadConfig::for_strategy(Strategy::kModelLevel)});
  auto prefetch = OffloadConfig::for_strategy(Strategy::kModelLevel);
  prefetch.device_budget_bytes = size_t{1} << 30;
  out.push_back({"model_level_prefetch_two_dits", prefetch, true});
  out.push_back({"model_level_prefetch_slow_link", prefetch, true, 50e6});
  for (auto policy : {ComponentPolicy::kAlternating, ComponentPolicy::kSequential}) {
    auto component = OffloadConfig::for_strategy(Strategy::kComponent);
    component.components = {"text_encoder", "transformer"};
    component.component_policy = policy;
    out.push_back({"component_" + to_string(policy), component});
  }
  return out;
}

class StrictBackends : public ::testing::TestWithParam<StrictCase> {};

// The run ends with the backend's destruction and no stats() (which synchronizes): the last
// unit of a layerwise step prefetches the first one of the next step, a model-level group
// prefetches its successor, and those copies are still in flight when the slots die.
TEST_P(StrictBackends, AWholeRunAndTheTeardownBreakNoRuleAndStayBitwiseExact) {
  const StrictCase& c = GetParam();
  Recorder recorder;
  TinyDiffusionPipeline pipe(pipeline_config(c.two_transformers));
  auto engine = make_cpu_sim_engine(strict(recorder, c.bandwidth));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  at::Tensor image;
  {
    auto backend = apply_offload(pipe, pipe.offload_spec(), c.config, engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    image = generate(pipe, engine->compute_device());
    image = generate(pipe, engine->compute_device());  // slots reused across runs
  }
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
  EXPECT_TRUE(at::equal(image, plain_image(c.two_transformers)));
}

// The calls a stage pipeline makes between requests: a hand-off brings a component to the
// device (a model-level group then prefetches its successor), the device ledger takes the room
// back; the backend dies right after a hand-off, with that prefetch in flight.
TEST_P(StrictBackends, HandOffsAndReleasesBetweenRunsBreakNoRule) {
  const StrictCase& c = GetParam();
  Recorder recorder;
  TinyDiffusionPipeline pipe(pipeline_config(c.two_transformers));
  auto engine = make_cpu_sim_engine(strict(recorder, c.bandwidth));
  auto compute_scope = engine->enter_compute();  // compute calls need one
  at::Tensor image;
  {
    auto backend = apply_offload(pipe, pipe.offload_spec(), c.config, engine);
    auto forward = backend->forward_scope();  // every forward runs in it
    generate(pipe, engine->compute_device());
    backend->ensure_on_device("text_encoder");
    backend->release_device();
    backend->ensure_on_device("transformer");
    image = generate(pipe, engine->compute_device());
    backend->release_device();
    backend->ensure_on_device("text_encoder");
  }
  EXPECT_TRUE(recorder.seen().empty()) << recorder.describe();
  EXPECT_TRUE(at::equal(image, plain_image(c.two_transformers)));
}

INSTANTIATE_TEST_SUITE_P(Strategies, StrictBackends, ::testing::ValuesIn(strict_cases()),
                         [](const auto& param_info) { return param_info.param.name; });

// ---- The compute scope: compute calls from inside OffloadBackend::forward_scope() ----------

TEST(SimDeviceRules, ComputeCallsOutsideAComputeScopeAreReported) {
  Recorder recorder;
  auto engine = make_cpu_sim_engine(strict(recorder));
  HostBuffer src = filled_host(*engine, 4096, 3);
  DeviceBuffer dst = engine->allocate_device(4096);
  const Event copied = engine->copy_async({CopyOp{src, 0, dst, 0, 4096}}, {});
  engine->compute_wait(copied);  // on CUDA: the caller's kernels would not wait for it
  engine->record_compute();
  EXPECT_EQ(recorder.kinds(),
            (std::vector<Kind>{Kind::kComputeOutsideScope, Kind::kComputeOutsideScope}));
  EXPECT_NE(recorder.seen()[0].message.find("forward_scope"), std::string::npos);
  {
    auto outer = engine->enter_compute();
    { auto inner = engine->enter_compute(); }  // scopes nest
    engine->compute_wait(copied);
    engine->record_compute();
  }
  EXPECT_EQ(recorder.seen().size(), 2u) << recorder.describe();
  engine->compute_wait(copied);  // the scope has ended
  EXPECT_EQ(recorder.seen().size(), 3u);
}

}  // namespace
}  // namespace omni::offload
