// SafetensorsCheckpoint: a directory's model.safetensors (or diffusers'
// diffusion_pytorch_model.safetensors) or the shards of its index.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu_offload/check.h"
#include "model_runner/weights/safetensors.h"
#include "similar_names.h"

namespace omni::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// transformers' names, then diffusers' (a component folder: transformer/, vae/).
constexpr std::array<const char*, 2> kStems = {"model", "diffusion_pytorch_model"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    OMNI_THROW("cannot read checkpoint index '", path, "': ", std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::parse_error& e) {
    OMNI_THROW("checkpoint index '", path, "' is not valid JSON (byte ", e.byte, "): ", e.what());
  }
}

// Shards sit next to the index; a name that climbs out of the directory is a broken or hostile
// index, not a layout worth supporting.
void check_shard_name(const std::string& index, const std::string& tensor,
                      const std::string& shard) {
  const fs::path p(shard);
  bool climbs = p.is_absolute() || shard.empty();
  for (const auto& part : p) climbs = climbs || part == "..";
  if (climbs) {
    OMNI_THROW("checkpoint index '", index, "': tensor '", tensor, "' maps to shard '", shard,
               "', which is not a file name relative to the index's directory");
  }
}

// The *.safetensors and *.index.json names in `dir`, to say what is there instead.
std::string checkpoint_like_files(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".safetensors") || ends_with(name, ".index.json")) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) return " (it has no .safetensors files)";
  std::string out = " (it has: ";
  for (size_t i = 0; i < found.size(); ++i) out += (i ? ", " : "") + found[i];
  return out + ")";
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  SafetensorsCheckpoint ckpt;
  ckpt.path_ = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  std::string index, single;
  if (fs::is_directory(status)) {
    const fs::path dir(path);
    for (const char* stem : kStems) {
      const fs::path stem_index = dir / (std::string(stem) + ".safetensors.index.json");
      const fs::path stem_single = dir / (std::string(stem) + ".safetensors");
      if (fs::exists(stem_index)) {
        index = stem_index.string();
      } else if (fs::exists(stem_single)) {
        single = stem_single.string();
      }
      if (!index.empty() || !single.empty()) break;
    }
    if (index.empty() && single.empty()) {
      OMNI_THROW("checkpoint directory '", path,
                 "' has none of model.safetensors.index.json, model.safetensors, "
                 "diffusion_pytorch_model.safetensors.index.json, "
                 "diffusion_pytorch_model.safetensors",
                 checkpoint_like_files(path));
    }
  } else if (!fs::exists(status)) {
    OMNI_THROW("checkpoint '", path, "' does not exist");
  } else if (ends_with(path, ".index.json")) {
    index = path;
  } else {
    single = path;
  }

  if (!single.empty()) {
    ckpt.files_.push_back(SafetensorsFile::open(single));
    for (const auto& name : ckpt.files_[0].names()) ckpt.owner_.emplace(name, 0);
    return ckpt;
  }

  const json root = read_json(index);
  const auto map_it = root.is_object() ? root.find("weight_map") : root.end();
  if (!root.is_object() || map_it == root.end() || !map_it->is_object()) {
    OMNI_THROW("checkpoint index '", index, "' has no 'weight_map' object");
  }
  // Open each shard once, in shard-name order; remember a tensor it should hold so that a
  // missing shard is reported with something the user recognizes.
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor it holds
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) {
      OMNI_THROW("checkpoint index '", index, "': weight_map['", tensor,
                 "'] must be a shard file name, got ", shard.type_name());
    }
    check_shard_name(index, tensor, shard.get<std::string>());
    first_tensor.emplace(shard.get<std::string>(), tensor);
  }
  const fs::path dir = fs::path(index).parent_path();
  std::map<std::string, size_t> shard_ids;
  for (const auto& [shard, tensor] : first_tensor) {
    const std::string shard_path = (dir / shard).string();
    try {
      ckpt.files_.push_back(SafetensorsFile::open(shard_path));
    } catch (const Error& e) {
      OMNI_THROW("checkpoint index '", index, "' lists shard '", shard, "' (e.g. for tensor '",
                 tensor, "'), which cannot be loaded: ", e.what());
    }
    shard_ids.emplace(shard, ckpt.files_.size() - 1);
  }
  for (const auto& [tensor, shard] : map_it->items()) {
    const size_t id = shard_ids.at(shard.get<std::string>());
    const SafetensorsFile& file = ckpt.files_[id];
    if (!file.has(tensor)) {
      OMNI_THROW("checkpoint index '", index, "' maps tensor '", tensor, "' to shard '",
                 file.path(), "', which does not contain it",
                 detail::similar_names_suffix(tensor, file.names()));
    }
    ckpt.owner_.emplace(tensor, id);
  }
  return ckpt;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, id] : owner_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file_for(const std::string& name) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) {
    OMNI_THROW("checkpoint '", path_, "' has no tensor '", name, "' among its ", owner_.size(),
               " tensors", detail::similar_names_suffix(name, names()));
  }
  return files_[it->second];
}

const TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  return file_for(name).info(name);
}

const uint8_t* SafetensorsCheckpoint::data(const std::string& name) const {
  return file_for(name).data(name);
}

at::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
  return file_for(name).tensor(name);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  return file_for(name).path();
}

}  // namespace omni::models
