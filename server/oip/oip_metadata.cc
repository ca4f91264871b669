#include "server/oip/oip_metadata.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attn::server::oip {

ServerDescription DescribeServer(std::string version) {
  // model_configuration: ModelConfig and GET .../config; binary_tensor_data: REST's raw tensors
  // after the JSON header (Inference-Header-Content-Length).
  return {"attnserve", std::move(version), {"model_configuration", "binary_tensor_data"}};
}

absl::StatusOr<ModelDescription> DescribeModel(core::ServingCore* core, std::string_view model,
                                               std::string_view version,
                                               const core::CallControl& control) {
  absl::StatusOr<const ServedModel*> served = core->models().Find(model);
  if (!served.ok()) return served.status();
  core::ModelInfoRequest request;
  request.model = (*served)->name;
  request.model_version = version;
  absl::StatusOr<core::ModelInfo> info = core->GetModelInfo(request, control);
  if (!info.ok()) return info.status();
  ModelDescription description;
  description.name = info->name;
  description.version = info->version;
  description.versions = info->available_versions;
  description.signature = SignatureOf(*info);
  description.info = *std::move(info);
  return description;
}

std::string ConfigDataType(std::string_view datatype) {
  if (datatype == "BYTES") return "TYPE_STRING";
  return absl::StrCat("TYPE_", AbslView(datatype));  // FP32, INT64, BOOL: the same word
}

std::vector<std::pair<std::string, std::string>> ConfigParameters(const ModelDescription& model) {
  const core::ModelInfo& info = model.info;
  return {{"served_version", model.version},
          {"default_pooling", info.default_pooling},
          {"default_normalize", info.default_normalize ? "true" : "false"},
          {"max_sequence_length", absl::StrCat(info.max_position_embeddings)},
          {"default_max_length", absl::StrCat(info.default_max_length)},
          {"max_inputs_per_request", absl::StrCat(info.max_inputs_per_request)},
          {"precision", info.precision},
          {"architecture", info.architecture}};
}

}  // namespace attn::server::oip
