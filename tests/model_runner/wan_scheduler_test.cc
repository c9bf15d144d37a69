// The Wan2.1 / Wan2.2 flow schedulers against diffusers 0.42.1 (tests/fixtures/wan_schedulers,
// written by make_wan_scheduler_fixture.py): timesteps, sigmas, every step's sample and
// add_noise for UniPC (flow_shift 3 and 5, and order 3 / bh1 / a disabled corrector / final
// sigma_min) and FlowMatchEuler (shift 7, and shift_terminal); FlowMatchEuler's dynamic shift as
// Qwen-Image's pipeline drives it (its released config, the pipeline's sigmas and mu) and a
// linear one; then the config and call errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "model_runner/diffusion/flow_schedulers.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/wan_schedulers";

struct Case {
  std::string name;
  std::string class_name;
  std::vector<int64_t> steps;  // the step counts the fixture ran, in order, on one scheduler
};

const Case kCases[] = {
    {"unipc_flow_shift3", "UniPCMultistepScheduler", {5, 2}},
    {"unipc_flow_shift5", "UniPCMultistepScheduler", {5, 2}},
    {"flow_match_euler_shift7", "FlowMatchEulerDiscreteScheduler", {5, 2}},
    {"unipc_flow_order3_bh1", "UniPCMultistepScheduler", {6, 3}},
    {"flow_match_euler_terminal", "FlowMatchEulerDiscreteScheduler", {4}},
};

// gtest names a failing case by this rather than by its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class WanSchedulerParity : public ::testing::TestWithParam<Case> {};

TEST_P(WanSchedulerParity, MatchesDiffusers) {
  const Case& c = GetParam();
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  const at::Tensor sample = ref.tensor("sample");
  const at::Tensor model_outputs = ref.tensor("model_outputs");
  std::unique_ptr<FlowScheduler> scheduler = load_flow_scheduler(kDir + "/" + c.name);
  EXPECT_EQ(scheduler->name(), c.class_name);
  EXPECT_EQ(scheduler->num_train_timesteps(), 1000);

  for (int64_t n : c.steps) {
    const std::string key = c.name + ".n" + std::to_string(n);
    scheduler->set_timesteps(n);
    ASSERT_EQ(scheduler->num_inference_steps(), n);
    const at::Tensor timesteps = ref.tensor(key + ".timesteps");
    EXPECT_EQ(scheduler->timesteps().scalar_type(), timesteps.scalar_type()) << key;
    EXPECT_TRUE(at::equal(scheduler->timesteps(), timesteps))
        << key << ": " << scheduler->timesteps() << " vs " << timesteps;
    const at::Tensor sigmas = ref.tensor(key + ".sigmas");
    ASSERT_EQ(scheduler->sigmas().sizes(), sigmas.sizes()) << key;
    const double sigma_diff = max_abs_diff(scheduler->sigmas(), sigmas);
    EXPECT_LE(sigma_diff, 1e-6) << key;

    const at::Tensor expected = ref.tensor(key + ".prev_samples");
    at::Tensor x = sample.clone();
    double step_diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      x = scheduler->step(model_outputs[i], i, x);
      ASSERT_EQ(x.scalar_type(), at::kFloat);
      const double d = max_abs_diff(x, expected[i]);
      EXPECT_LE(d, 1e-5) << key << " step " << i;
      step_diff = std::max(step_diff, d);
    }
    const double noise_diff = max_abs_diff(scheduler->add_noise(sample, model_outputs[0], 1),
                                           ref.tensor(key + ".noised"));
    EXPECT_LE(noise_diff, 1e-6) << key;
    std::cout << "[ max abs diff ] " << key << ": sigmas " << sigma_diff << ", steps " << step_diff
              << ", add_noise " << noise_diff << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixture, WanSchedulerParity, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return param.param.name;
                         });

struct DynamicRun {
  int64_t steps;
  int64_t image_seq_len;
  bool pipeline_sigmas;  // linear_sigmas(steps), as Qwen-Image and FLUX pass; else the default
};

TEST(FlowMatchEulerDynamicShift, MatchesDiffusersAsThePipelinesCallIt) {
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  const at::Tensor sample = ref.tensor("sample");
  const at::Tensor model_outputs = ref.tensor("model_outputs");
  for (const auto& [name, runs] : std::vector<std::pair<std::string, std::vector<DynamicRun>>>{
           {"flow_match_euler_qwen_image", {{5, 4096, true}, {3, 1296, true}}},
           {"flow_match_euler_dynamic_linear", {{4, 1024, false}}}}) {
    std::string folder = kDir + "/";
    folder += name;
    auto loaded = load_flow_scheduler(folder);
    auto* scheduler = dynamic_cast<FlowMatchEulerScheduler*>(loaded.get());
    ASSERT_NE(scheduler, nullptr) << name;
    EXPECT_TRUE(scheduler->config().dynamic_shifting) << name;
    for (const auto& run : runs) {
      const std::string key =
          name + ".n" + std::to_string(run.steps) + ".l" + std::to_string(run.image_seq_len);
      const double mu = scheduler->mu_for(run.image_seq_len);
      EXPECT_EQ(mu, ref.tensor(key + ".mu").item<double>()) << key;
      if (run.pipeline_sigmas) {
        scheduler->set_sigmas(FlowMatchEulerScheduler::linear_sigmas(run.steps), mu);
      } else {
        scheduler->set_timesteps(run.steps, mu);
      }
      ASSERT_EQ(scheduler->num_inference_steps(), run.steps) << key;
      const at::Tensor timesteps = ref.tensor(key + ".timesteps");
      EXPECT_TRUE(at::equal(scheduler->timesteps(), timesteps))
          << key << ": " << scheduler->timesteps() << " vs " << timesteps;
      const at::Tensor sigmas = ref.tensor(key + ".sigmas");
      EXPECT_TRUE(at::equal(scheduler->sigmas(), sigmas))
          << key << ": " << scheduler->sigmas() << " vs " << sigmas;
      const at::Tensor expected = ref.tensor(key + ".prev_samples");
      at::Tensor x = sample.clone();
      double step_diff = 0;
      for (int64_t i = 0; i < run.steps; ++i) {
        x = scheduler->step(model_outputs[i], i, x);
        step_diff = std::max(step_diff, max_abs_diff(x, expected[i]));
      }
      EXPECT_LE(step_diff, 1e-5) << key;
      std::cout << "[ max abs diff ] " << key << ": steps " << step_diff << "\n";
    }
  }
}

// A fixture config with one field changed (or removed, for a null value), written to a fresh
// folder: what load_flow_scheduler says about it.
class WanSchedulerConfigErrors : public testing::TempDirTest {
 protected:
  std::string load_error(const std::string& fixture, const std::string& field,
                         const nlohmann::json& value) {
    std::ifstream in(kDir + "/" + fixture + "/scheduler_config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    if (value.is_null()) {
      config.erase(field);
    } else {
      config[field] = value;
    }
    testing::write_bytes(path("scheduler_config.json"), config.dump(2));
    return error_of([&] { load_flow_scheduler(dir()); });
  }
};

TEST_F(WanSchedulerConfigErrors, UniPCRejectsWhatTheFlowPathDoesNotCover) {
  const std::string unipc = "unipc_flow_shift3";
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"prediction_type", "epsilon"},
           {"use_flow_sigmas", false},
           {"predict_x0", false},
           {"solver_order", 4},
           {"solver_type", "dpmsolver"},
           {"lower_order_final", false},
           {"final_sigmas_type", "last"},
           {"thresholding", true},
           {"use_dynamic_shifting", true},
           {"use_karras_sigmas", true},
           {"solver_p", {{"_class_name", "DDIMScheduler"}}},
           {"flow_shift", "3.0"},             // a string, not a number
           {"variance_type", "fixed_small"},  // not a UniPC field
       }) {
    SCOPED_TRACE(field);
    const std::string error = load_error(unipc, field, value);
    EXPECT_CONTAINS(error, "'" + field + "'");
    EXPECT_CONTAINS(error, "scheduler_config.json");
  }
  EXPECT_CONTAINS(load_error(unipc, "prediction_type", "epsilon"), "\"epsilon\"");
  EXPECT_CONTAINS(load_error(unipc, "solver_order", 4), "= 4");
  // Invalid values the config reader lets through are checked by the constructor.
  EXPECT_CONTAINS(load_error(unipc, "flow_shift", -1.0), "flow_shift must be finite and > 0");
}

TEST_F(WanSchedulerConfigErrors, FlowMatchEulerRejectsWhatWanDoesNotUse) {
  const std::string euler = "flow_match_euler_shift7";
  for (const char* field : {"invert_sigmas", "use_karras_sigmas", "use_exponential_sigmas",
                            "use_beta_sigmas", "stochastic_sampling"}) {
    SCOPED_TRACE(field);
    const std::string error = load_error(euler, field, true);
    EXPECT_CONTAINS(error, std::string("'") + field + "' = true");
  }
  EXPECT_CONTAINS(load_error(euler, "time_shift_type", "cubic"), "'time_shift_type'");
  EXPECT_CONTAINS(load_error(euler, "flow_shift", 3.0), "'flow_shift'");  // UniPC's name
  EXPECT_CONTAINS(load_error(euler, "shift", 0.0), "shift must be finite and > 0");
  EXPECT_CONTAINS(load_error("flow_match_euler_qwen_image", "max_image_seq_len", 256),
                  "max_image_seq_len and base_image_seq_len must differ");
}

// Dynamic shifting needs the image's mu; the caller's sigmas must be noise levels.
TEST(WanSchedulerCalls, DynamicShiftingNeedsMuAndSigmasInRange) {
  FlowMatchEulerScheduler::Config config;
  config.dynamic_shifting = true;
  FlowMatchEulerScheduler dynamic(config);
  EXPECT_CONTAINS(error_of([&] { dynamic.set_timesteps(4); }), "needs mu");
  EXPECT_CONTAINS(error_of([&] { dynamic.set_sigmas({1.0, 0.5}); }), "needs mu");
  EXPECT_CONTAINS(error_of([&] {
                    dynamic.set_sigmas({1.0, 0.0}, 1.0);
                  }),
                  "sigmas must be in (0, 1], sigma 1 is 0");
  EXPECT_CONTAINS(error_of([&] { dynamic.set_sigmas({1.5}, 1.0); }), "sigma 0 is 1.5");
  EXPECT_CONTAINS(error_of([&] { dynamic.set_sigmas({}, 1.0); }), "at least one sigma");
  EXPECT_CONTAINS(error_of([&] { FlowMatchEulerScheduler::linear_sigmas(0); }), "got 0");
  dynamic.set_sigmas(FlowMatchEulerScheduler::linear_sigmas(3), 1.0);
  EXPECT_EQ(dynamic.num_inference_steps(), 3);
  // Without dynamic shifting mu changes nothing, as in diffusers.
  FlowMatchEulerScheduler fixed(FlowMatchEulerScheduler::Config{});
  fixed.set_timesteps(3);
  const at::Tensor without = fixed.sigmas().clone();
  fixed.set_timesteps(3, 2.0);
  EXPECT_TRUE(at::equal(fixed.sigmas(), without));
}

TEST_F(WanSchedulerConfigErrors, ClassNameIsRequiredAndKnown) {
  EXPECT_CONTAINS(load_error("unipc_flow_shift3", "_class_name", nullptr),
                  "'_class_name' is missing");
  const std::string error = load_error("unipc_flow_shift3", "_class_name", "DDIMScheduler");
  EXPECT_CONTAINS(error, "'_class_name' = \"DDIMScheduler\"");
  EXPECT_CONTAINS(error_of([&] { load_flow_scheduler(path("absent")); }), "absent");
  // The class's own reader checks the name too.
  testing::write_bytes(path("scheduler_config.json"),
                       R"({"_class_name": "UniPCMultistepScheduler", "shift": 7.0})");
  EXPECT_CONTAINS(
      error_of([&] {
        FlowMatchEulerScheduler::parse_config(HfConfig::load(path("scheduler_config.json")));
      }),
      "expected \"FlowMatchEulerDiscreteScheduler\"");
}

TEST(WanSchedulerCalls, LoadsFromTheFileToo) {
  auto scheduler = load_flow_scheduler(kDir + "/unipc_flow_shift5/scheduler_config.json");
  EXPECT_EQ(std::string(scheduler->name()), "UniPCMultistepScheduler");
  auto* unipc = dynamic_cast<UniPCMultistepScheduler*>(scheduler.get());
  ASSERT_NE(unipc, nullptr);
  EXPECT_EQ(unipc->config().flow_shift, 5.0);
  EXPECT_EQ(unipc->config().solver_order, 2);
  EXPECT_TRUE(unipc->config().solver_bh2);
}

TEST(WanSchedulerCalls, StepErrors) {
  UniPCMultistepScheduler unipc(UniPCMultistepScheduler::Config{});
  const at::Tensor x = at::randn({1, 4, 2, 2});
  EXPECT_CONTAINS(error_of([&] { unipc.step(x, 0, x); }), "call set_timesteps first");
  EXPECT_CONTAINS(error_of([&] { unipc.set_timesteps(0); }),
                  "num_inference_steps must be >= 1, got 0");
  unipc.set_timesteps(3);
  // UniPC keeps a history: steps run in order.
  EXPECT_CONTAINS(error_of([&] { unipc.step(x, 1, x); }), "step_index must be 0");
  EXPECT_CONTAINS(error_of([&] { unipc.step(x, 3, x); }), "step_index must be in [0, 3), got 3");
  EXPECT_CONTAINS(error_of([&] {
                    unipc.step(x.view({4, 2, 2}).narrow(0, 0, 2), 0, x);
                  }),
                  "differ in shape");
  unipc.step(x, 0, x);
  EXPECT_CONTAINS(error_of([&] { unipc.step(x, 0, x); }), "step_index must be 1");

  FlowMatchEulerScheduler euler(FlowMatchEulerScheduler::Config{});
  euler.set_timesteps(2);
  EXPECT_CONTAINS(error_of([&] { euler.step(x, -1, x); }), "got -1");
  // Euler keeps no history: any step in range, e.g. to resume a loop.
  EXPECT_NO_THROW(euler.step(x, 1, x));
  EXPECT_CONTAINS(error_of([&] { euler.add_noise(x, x, 2); }), "got 2");
}

// Half-precision model outputs: the update runs in float32 and comes back in the model's dtype
// for FlowMatchEuler, in the sample's for UniPC, as diffusers does.
TEST(WanSchedulerCalls, ResultDtypes) {
  const at::Tensor x = at::randn({1, 4, 2, 2});
  const at::Tensor v = at::randn({1, 4, 2, 2}).to(at::kBFloat16);
  FlowMatchEulerScheduler euler(FlowMatchEulerScheduler::Config{});
  euler.set_timesteps(2);
  EXPECT_EQ(euler.step(v, 0, x).scalar_type(), at::kBFloat16);
  UniPCMultistepScheduler unipc(UniPCMultistepScheduler::Config{});
  unipc.set_timesteps(2);
  EXPECT_EQ(unipc.step(v, 0, x).scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace omni::models
