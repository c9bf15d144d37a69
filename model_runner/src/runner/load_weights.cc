#include "model_runner/weights/load_weights.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <sstream>

#include "cpu_offload/check.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {
namespace {

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

}  // namespace

LoadWeightsReport load_weights(torch::nn::Module& module, const SafetensorsCheckpoint& checkpoint,
                               const std::string& prefix, bool defer_conversion) {
  LoadWeightsReport report;
  std::set<std::string> expected;
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string name = prefix + item.key();
    expected.insert(name);
    at::Tensor& param = item.value();
    if (!checkpoint.has(name)) {
      checkpoint.info(name);  // throws: names the checkpoint, the tensor and similar names
    }
    const TensorInfo& info = checkpoint.info(name);
    if (at::IntArrayRef(info.shape) != param.sizes()) {
      OMNI_THROW(checkpoint.file_of(name), ": tensor ", name, " has shape ", shape_str(info.shape),
                 ", the model (from config.json) expects ", shape_str(param.sizes()));
    }
    at::Tensor source = checkpoint.tensor(name);
    if (source.scalar_type() != param.scalar_type()) {
      if (defer_conversion) {
        report.deferred.emplace(item.key(), param.scalar_type());
      } else {
        source = source.to(param.scalar_type());
      }
      ++report.converted;
    }
    if (source.scalar_type() == info.dtype) {  // still the file's bytes
      report.files.emplace(
          item.key(), offload::TensorFileExtent{checkpoint.file_of(name), info.offset, info.nbytes,
                                                info.dtype});
    }
    at::NoGradGuard no_grad;
    param.set_data(source);
    ++report.tensors;
    report.bytes += static_cast<int64_t>(source.nbytes());
  }
  std::vector<std::string> unexpected;
  for (const auto& name : checkpoint.names()) {
    if (name.compare(0, prefix.size(), prefix) == 0 && !expected.count(name)) {
      unexpected.push_back(name);
    }
  }
  if (!unexpected.empty()) {
    std::ostringstream list;
    for (size_t i = 0; i < unexpected.size() && i < 5; ++i) {
      list << (i ? ", " : "") << unexpected[i];
    }
    if (unexpected.size() > 5) list << ", ... (" << unexpected.size() << " in all)";
    OMNI_THROW(checkpoint.path(), ": ", unexpected.size(), " tensor(s) under \"", prefix,
               "\" that the model (from config.json) does not have: ", list.str());
  }
  return report;
}

void defer_conversions(const LoadWeightsReport& report, const std::string& root_prefix,
                       std::unordered_map<std::string, at::ScalarType>& convert_dtypes) {
  for (const auto& [name, dtype] : report.deferred) convert_dtypes[root_prefix + name] = dtype;
}

void add_disk_files(const LoadWeightsReport& report, const std::string& root_prefix,
                    offload::TensorFiles& disk_files) {
  for (const auto& [name, extent] : report.files) disk_files[root_prefix + name] = extent;
}

at::ScalarType resolve_dtype(at::ScalarType requested, const SafetensorsCheckpoint& checkpoint,
                             const std::string& prefix) {
  if (requested != at::ScalarType::Undefined) return requested;
  std::map<at::ScalarType, int64_t> bytes;
  for (const auto& name : checkpoint.names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const TensorInfo& info = checkpoint.info(name);
    if (at::isFloatingType(info.dtype)) bytes[info.dtype] += static_cast<int64_t>(info.nbytes);
  }
  at::ScalarType best = at::kFloat;
  int64_t most = 0;
  for (const auto& [dtype, n] : bytes) {
    if (n > most) best = dtype, most = n;
  }
  return best;
}

}  // namespace omni::models
