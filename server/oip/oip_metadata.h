// What the Open Inference Protocol's metadata calls say, free of their two transports: the
// server (name, version, extensions), a model and version (ModelMetadata) and its configuration
// (Triton's ModelConfig). oip_service.cc writes them as protobuf, oip_rest.cc as JSON.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/serving_core.h"
#include "server/oip/infer_call.h"

namespace attn::server::oip {

struct ServerDescription {
  std::string name;     // "attnserve"
  std::string version;  // the server's release
  std::vector<std::string> extensions;
};
// `version`: the release (ATTN_VERSION), given by the caller that links it.
ServerDescription DescribeServer(std::string version);

struct ModelDescription {
  std::string name;                   // the served model's name
  std::string version;                // the version described (the served one by default)
  std::vector<std::string> versions;  // every version it has
  core::ModelInfo info;
  ModelSignature signature;
};

// The model `model` (by name; "" = the default model) at `version` ("" = the served one):
// NOT_FOUND naming the served models or that model's versions.
absl::StatusOr<ModelDescription> DescribeModel(core::ServingCore* core, std::string_view model,
                                               std::string_view version,
                                               const core::CallControl& control);

// Triton's configuration datatype for a protocol datatype ("BYTES" -> "TYPE_STRING").
std::string ConfigDataType(std::string_view datatype);
// The configuration's parameters: the model's defaults, as strings.
std::vector<std::pair<std::string, std::string>> ConfigParameters(const ModelDescription& model);

}  // namespace attn::server::oip
