#include "runtime/settings.h"

#include <algorithm>

namespace klinear {

namespace {

// A positive integer field, as the seed's sizes are.
Status check_positive(const Json& v, const std::string& name, const std::string& where) {
  if (v.is_number_integer() && v.get<int64_t>() >= 1) return Status();
  return Status::InvalidArgument(where + ": " + name + ": expected a positive integer, got " + v.dump());
}

// The checks of RUNTIME.md "Checks before running" on the fields klinear shares with the seed.
Status check_field(const std::string& key, const Json& v, const std::string& where) {
  if (key == "pa_block_size") {
    KL_RETURN_IF_ERROR(check_positive(v, key, where));
    if (v.get<int64_t>() % 16 != 0)
      return Status::InvalidArgument(where + ": pa_block_size " + v.dump() + ": the paged cache needs a multiple of 16");
    return Status();
  }
  if (key == "batch_size_per_rank" || key == "input_max_len" || key == "max_new_tokens" ||
      key == "prefill_mini_batch_size")
    return check_positive(v, key, where);
  return Status();
}

// draft_model_type and next_n agree: none and 0, or dspark and more than 0; dspark is not built.
Status check_draft(const Json* type, const Json* next_n, const std::string& where) {
  std::string draft = "none";
  if (type && !type->is_null()) {
    if (!type->is_string())
      return Status::InvalidArgument(where + ": draft_model_type: expected a string, got " + type->dump());
    draft = type->get<std::string>();
    if (draft != "none" && draft != "dspark")
      return Status::InvalidArgument(where + ": draft_model_type " + type->dump() + ": unknown (expected none or dspark)");
  }
  int64_t n = 0;
  if (next_n) {
    if (!next_n->is_number_integer() || next_n->get<int64_t>() < 0)
      return Status::InvalidArgument(where + ": next_n: expected an integer of at least 0, got " + next_n->dump());
    n = next_n->get<int64_t>();
  }
  if (draft == "none" && n != 0)
    return Status::InvalidArgument(where + ": next_n " + std::to_string(n) +
                                   " without a draft model (draft_model_type none): it must be 0");
  if (draft == "dspark" && n == 0)
    return Status::InvalidArgument(where + ": draft_model_type dspark with next_n 0: the draft proposes next_n > 0 "
                                   "tokens");
  if (draft == "dspark")
    return Status::NotSupported(where + ": draft_model_type dspark: speculative decoding is not built yet (issue 39)");
  return Status();
}

}  // namespace

Result<RunnerSettings> parse_runner_settings(const Json& settings, const std::string& where) {
  if (!settings.is_object())
    return Status::InvalidArgument(where + ": expected a JSON object with model_config, parallel_config and/or "
                                   "data_config, got " + settings.dump().substr(0, 80));
  RunnerSettings r;
  const Json *draft = nullptr, *next_n = nullptr;
  for (const auto& [section, body] : settings.items()) {
    if (section != "model_config" && section != "parallel_config" && section != "data_config")
      return Status::InvalidArgument(where + ": " + section + ": not a section of the settings (expected "
                                     "model_config, parallel_config, data_config)");
    if (!body.is_object())
      return Status::InvalidArgument(where + ": " + section + ": expected an object, got " + body.dump().substr(0, 80));
    if (section == "parallel_config") {
      auto parsed = parse_parallel_config(body);
      if (!parsed.ok()) return parsed.status().with_context(where);
      ParallelSizes sizes = *parsed;
      if (!body.contains("world_size")) sizes.world = sizes.tensor * sizes.data;
      if (sizes.world != sizes.tensor * sizes.data)
        return Status::InvalidArgument(where + ": parallel_config.world_size " + std::to_string(sizes.world) +
                                       ", but attn_tp_size " + std::to_string(sizes.tensor) + " x attn_dp_size " +
                                       std::to_string(sizes.data) + " make " +
                                       std::to_string(sizes.tensor * sizes.data) + " ranks");
      r.parallel = sizes;
      continue;
    }
    for (const auto& [key, value] : body.items()) {
      KL_RETURN_IF_ERROR(check_field(key, value, where));
      if (key == "draft_model_type") draft = &value;
      if (key == "next_n") next_n = &value;
      r.fields.push_back({section + "." + key, value, false});
    }
  }
  KL_RETURN_IF_ERROR(check_draft(draft, next_n, where));
  std::sort(r.fields.begin(), r.fields.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return r;
}

const Json* RunnerSettings::take(const std::string& key) {
  for (Field& f : fields)
    if (f.name == "model_config." + key || f.name == "data_config." + key) {
      f.used = true;
      return &f.value;
    }
  return nullptr;
}

std::vector<std::string> RunnerSettings::unused() const {
  std::vector<std::string> names;
  for (const Field& f : fields)
    if (!f.used) names.push_back(f.name);
  return names;
}

Result<RunnerSettings> read_runner_settings(const std::string& path) {
  KL_ASSIGN_OR_RETURN(Json settings, read_json_file(path));
  return parse_runner_settings(settings, "--settings " + path);
}

}  // namespace klinear
