// Helpers the flow schedulers share: reading diffusers' scheduler_config.json strictly, and the
// sigma arithmetic diffusers does in numpy before it rounds to float32.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "model_runner/weights/hf_config.h"

namespace omni::models::flow_util {

// Throws when "_class_name" is present and is not `scheduler`.
void check_class_name(const HfConfig& json, const char* scheduler);
// Throws naming the first field that is neither in `known` nor diffusers metadata ("_..."): a
// field this code does not know might change the schedule, so it is not ignored.
void check_known_fields(const HfConfig& json, const char* scheduler,
                        std::initializer_list<const char*> known);
// Throws when the boolean `field` is true; `why` says what it would need.
void require_false(const HfConfig& json, const char* scheduler, const char* field, const char* why);
// Throws when `field` is present and not null.
void require_null(const HfConfig& json, const char* scheduler, const char* field, const char* why);
// The string `field` (or `fallback` when absent), which must be one of `allowed`.
std::string get_choice(const HfConfig& json, const char* scheduler, const char* field,
                       const char* fallback, std::initializer_list<const char*> allowed);
// The optional number `field` (absent or null: nullopt).
std::optional<double> get_optional_double(const HfConfig& json, const char* field);

// num_train_timesteps >= 1 and a finite shift > 0.
void check_schedule(const char* scheduler, int64_t num_train_timesteps, const char* shift_name,
                    double shift);
// num_inference_steps >= 1.
void check_num_steps(const char* scheduler, int64_t num_inference_steps);

// numpy.linspace(start, stop, num) in float64, element for element.
std::vector<double> linspace(double start, double stop, int64_t num);
// The static time shift of flow matching: shift * s / (1 + (shift - 1) * s). Both compute in the
// dtype of `sigmas` (float64, or float32 for a caller's sigmas), operation for operation as numpy
// does (a Python float meeting a float32 array is rounded to float32 first).
at::Tensor shift_sigmas(const at::Tensor& sigmas, double shift);
// diffusers' stretch_shift_to_terminal: rescales 1 - s so the last sigma is `terminal`.
at::Tensor stretch_to_terminal(const at::Tensor& sigmas, double terminal);

}  // namespace omni::models::flow_util
