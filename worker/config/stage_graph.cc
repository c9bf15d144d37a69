// The stage graph: ids, sources, entry and final stages, cycles; the graph's orders.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "worker/config/stage_config.h"

namespace omni::config {
namespace {

using detail::fail;
using detail::join;

std::string join_ids(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

std::vector<int64_t> ids_of(const PipelineConfig& config) {
  std::vector<int64_t> ids;
  for (const auto& stage : config.stages) ids.push_back(stage.stage_id);
  return ids;
}

// A cycle of the graph where stage i reads the stages reads[i], found by a depth-first walk: the
// stage indices in data-flow order (first == last), or empty when there is none.
std::vector<size_t> find_cycle(const std::vector<std::vector<size_t>>& reads) {
  const size_t n = reads.size();
  std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<size_t> path;
  std::vector<size_t> cycle;
  std::function<bool(size_t)> visit = [&](size_t i) {
    color[i] = 1;
    path.push_back(i);
    for (size_t j : reads[i]) {
      if (color[j] == 1) {
        auto it = std::find(path.begin(), path.end(), j);
        cycle.assign(it, path.end());
        cycle.push_back(j);
        std::reverse(cycle.begin(), cycle.end());  // i reads j: data flows j -> i
        return true;
      }
      if (color[j] == 0 && visit(j)) return true;
    }
    path.pop_back();
    color[i] = 2;
    return false;
  };
  for (size_t i = 0; i < n; ++i) {
    if (color[i] == 0 && visit(i)) return cycle;
  }
  return {};
}

}  // namespace

// --- the graph ----------------------------------------------------------------------------------

std::string SourceLocation::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

const StageConfig& PipelineConfig::stage(int64_t id) const {
  for (const auto& s : stages) {
    if (s.stage_id == id) return s;
  }
  throw ConfigError(path + ": no stage " + std::to_string(id) +
                    " (stages: " + join_ids(ids_of(*this)) + ")");
}

std::vector<int64_t> PipelineConfig::topological_order() const {
  std::vector<int64_t> order;
  std::set<int64_t> done;
  std::vector<bool> placed(stages.size(), false);
  // Kahn's algorithm; among the ready stages the first in the file goes first.
  for (bool progress = true; progress && order.size() < stages.size();) {
    progress = false;
    for (size_t i = 0; i < stages.size(); ++i) {
      if (placed[i]) continue;
      const auto& sources = stages[i].engine_input_source;
      if (std::all_of(sources.begin(), sources.end(),
                      [&](int64_t id) { return done.count(id) > 0; })) {
        placed[i] = true;
        done.insert(stages[i].stage_id);
        order.push_back(stages[i].stage_id);
        progress = true;
        break;
      }
    }
  }
  for (size_t i = 0; i < stages.size(); ++i) {  // only an unvalidated config has leftovers
    if (!placed[i]) order.push_back(stages[i].stage_id);
  }
  return order;
}

std::vector<int64_t> PipelineConfig::entry_stages() const {
  std::vector<int64_t> entries;
  for (const auto& s : stages) {
    if (s.engine_input_source.empty()) entries.push_back(s.stage_id);
  }
  return entries;
}

namespace detail {

void validate_stages(const PipelineConfig& config, const std::vector<StageMarks>& marks,
                     const std::string& list_where) {
  const auto& stages = config.stages;
  if (stages.empty()) fail(list_where, "the pipeline has no stages");
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < stages.size(); ++i) {
    const int64_t id = stages[i].stage_id;
    if (id < 0) fail(marks[i].stage_id, "stage_id must be >= 0, got " + std::to_string(id));
    const auto [it, inserted] = index.emplace(id, i);
    if (!inserted) {
      fail(marks[i].stage_id, "stage_id " + std::to_string(id) + " is used twice (first at " +
                                  marks[it->second].stage_id + ")");
    }
  }
  const std::vector<int64_t> ids = ids_of(config);
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageConfig& s = stages[i];
    const std::string name = "stage " + std::to_string(s.stage_id);
    if (s.engine.model_stage.empty()) {
      fail(marks[i].required, name + " has no model_stage (" + join(model_stage_names()) + ")");
    }
    if (s.engine.model.empty()) {
      fail(marks[i].required, name + " has no model (the checkpoint directory)");
    }
    if (s.final_output && s.final_output_type.empty()) {
      const std::string types = join(output_type_names());
      std::string message = name;
      message += ": final_output is true but final_output_type is not set (" + types + ")";
      fail(marks[i].final_output, message);
    }
    std::set<int64_t> seen;
    for (size_t j = 0; j < s.engine_input_source.size(); ++j) {
      const int64_t source = s.engine_input_source[j];
      const std::string& where = j < marks[i].sources.size() ? marks[i].sources[j] : marks[i].stage;
      if (source == s.stage_id) fail(where, name + " lists itself in engine_input_source");
      if (!index.count(source)) {
        fail(where, "engine_input_source: no stage " + std::to_string(source) +
                        " (stages: " + join_ids(ids) + ")");
      }
      if (!seen.insert(source).second) {
        fail(where, "engine_input_source lists stage " + std::to_string(source) + " twice");
      }
    }
  }
  if (config.entry_stages().empty()) {
    fail(list_where,
         "no entry stage: every stage has an engine_input_source, so none reads "
         "the request");
  }
  std::vector<std::vector<size_t>> reads(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    for (int64_t source : stages[i].engine_input_source) reads[i].push_back(index.at(source));
  }
  const std::vector<size_t> cycle = find_cycle(reads);
  if (!cycle.empty()) {
    std::string path;
    for (size_t i : cycle) {
      path += (path.empty() ? "" : " -> ") + ("stage " + std::to_string(stages[i].stage_id));
    }
    fail(marks[cycle.front()].stage, "engine_input_source forms a cycle: " + path);
  }
  if (std::none_of(stages.begin(), stages.end(), [](const auto& s) { return s.final_output; })) {
    fail(list_where, "no stage has final_output: true, so a request would never finish");
  }
}

void validate_pipeline(const PipelineConfig& config) {
  std::vector<StageMarks> marks;
  for (const auto& stage : config.stages) {
    const std::string where = stage.location.str();
    marks.push_back({where, where, where, where, {}});
  }
  validate_stages(config, marks, config.path);
}

}  // namespace detail
}  // namespace omni::config
