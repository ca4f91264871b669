#include "server/oip/oip_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/quote.h"
#include "server/auth.h"
#include "server/oip/oip_metadata.h"

namespace attn::server::oip {
namespace {

using google::protobuf::Map;

absl::StatusOr<ParameterValue> ValueOf(const inference::InferParameter& p, std::string_view name) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      return ParameterValue(p.bool_param());
    case inference::InferParameter::kInt64Param:
      return ParameterValue(p.int64_param());
    case inference::InferParameter::kUint64Param:
      return ParameterValue(p.uint64_param());
    case inference::InferParameter::kDoubleParam:
      return ParameterValue(p.double_param());
    case inference::InferParameter::kStringParam:
      return ParameterValue(p.string_param());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", AbslView(name),
                       "' has no value (set one of bool_param, int64_param, "
                       "uint64_param, double_param, string_param)"));
  }
}

absl::StatusOr<std::vector<Parameter>> ParametersOf(
    const Map<std::string, inference::InferParameter>& map) {
  std::vector<Parameter> parameters;
  for (const auto& [name, value] : map) {
    absl::StatusOr<ParameterValue> read = ValueOf(value, name);
    if (!read.ok()) return read.status();
    parameters.push_back({name, *std::move(read)});
  }
  return parameters;
}

// Which typed list of `contents` holds elements ("" when none).
std::string_view TypedField(const inference::InferTensorContents& c) {
  if (c.bytes_contents_size() > 0) return "bytes_contents";
  if (c.int64_contents_size() > 0) return "int64_contents";
  if (c.fp32_contents_size() > 0) return "fp32_contents";
  if (c.int_contents_size() > 0) return "int_contents";
  if (c.uint_contents_size() > 0) return "uint_contents";
  if (c.uint64_contents_size() > 0) return "uint64_contents";
  if (c.fp64_contents_size() > 0) return "fp64_contents";
  if (c.bool_contents_size() > 0) return "bool_contents";
  return "";
}

void FillSignature(const ModelDescription& model, inference::ModelMetadataResponse* out) {
  out->set_name(model.name);
  for (const std::string& v : model.versions) out->add_versions(v);
  out->set_platform(kPlatform);
  for (const auto& [specs, add] :
       {std::pair{&model.signature.inputs, &inference::ModelMetadataResponse::add_inputs},
        std::pair{&model.signature.outputs, &inference::ModelMetadataResponse::add_outputs}}) {
    for (const TensorSpec& spec : *specs) {
      inference::ModelMetadataResponse::TensorMetadata* t = (out->*add)();
      t->set_name(spec.name);
      t->set_datatype(spec.datatype);
      for (int64_t d : spec.shape) t->add_shape(d);
    }
  }
}

inference::DataType ProtoDataType(std::string_view datatype) {
  inference::DataType type = inference::TYPE_INVALID;
  inference::DataType_Parse(ConfigDataType(datatype), &type);
  return type;
}

void FillConfig(const ModelDescription& model, inference::ModelConfig* out) {
  out->set_name(model.name);
  out->set_platform(kPlatform);
  out->set_backend(kPlatform);
  out->set_max_batch_size(0);  // the shapes carry the batch dimension
  for (const TensorSpec& spec : model.signature.inputs) {
    inference::ModelInput* input = out->add_input();
    input->set_name(spec.name);
    input->set_data_type(ProtoDataType(spec.datatype));
    for (int64_t d : spec.shape) input->add_dims(d);
    input->set_optional(spec.optional);
  }
  for (const TensorSpec& spec : model.signature.outputs) {
    inference::ModelOutput* output = out->add_output();
    output->set_name(spec.name);
    output->set_data_type(ProtoDataType(spec.datatype));
    for (int64_t d : spec.shape) output->add_dims(d);
  }
  for (const auto& [key, value] : ConfigParameters(model)) {
    (*out->mutable_parameters())[key].set_string_value(value);
  }
}

}  // namespace

absl::StatusOr<InferRequest> FromProto(const inference::ModelInferRequest& request) {
  InferRequest out;
  out.model = request.model_name();
  out.version = request.model_version();
  out.id = request.id();
  absl::StatusOr<std::vector<Parameter>> parameters = ParametersOf(request.parameters());
  if (!parameters.ok()) return parameters.status();
  out.parameters = *std::move(parameters);
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", request.raw_input_contents_size(), " entries for ",
        request.inputs_size(), " inputs; give one per input, in order (or use contents)"));
  }
  for (int i = 0; i < request.inputs_size(); ++i) {
    const inference::ModelInferRequest::InferInputTensor& in = request.inputs(i);
    InputTensor t;
    t.name = in.name();
    t.datatype = in.datatype();
    t.shape.assign(in.shape().begin(), in.shape().end());
    absl::StatusOr<std::vector<Parameter>> tensor_parameters = ParametersOf(in.parameters());
    if (!tensor_parameters.ok()) return tensor_parameters.status();
    t.parameters = *std::move(tensor_parameters);
    t.typed_field = TypedField(in.contents());
    t.has_typed_contents = !t.typed_field.empty();
    if (raw) {
      if (t.has_typed_contents) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", QuoteInput(t.name), " has contents.", AbslView(t.typed_field),
                         " although the request sends raw_input_contents; use one or the other"));
      }
      t.raw = request.raw_input_contents(i);
    } else {
      for (const std::string& b : in.contents().bytes_contents()) t.bytes_contents.push_back(b);
      t.int64_contents.assign(in.contents().int64_contents().begin(),
                              in.contents().int64_contents().end());
    }
    out.inputs.push_back(std::move(t));
  }
  for (const auto& requested : request.outputs()) {
    absl::StatusOr<std::vector<Parameter>> output_parameters = ParametersOf(requested.parameters());
    if (!output_parameters.ok()) return output_parameters.status();
    out.outputs.push_back({requested.name(), *std::move(output_parameters)});
  }
  return out;
}

OipService::OipService(core::ServingCore* core, MemoryBudget* memory_budget, OipOptions options,
                       Metrics* metrics, std::optional<std::string> api_key)
    : core_(core),
      options_(std::move(options)),
      metrics_(metrics),
      inferrer_(core, memory_budget,
                {options_.max_message_bytes, options_.max_request_memory_bytes}) {
  if (api_key.has_value()) {
    authorize_ = [key = std::move(*api_key)](const grpc::CallbackServerContext& context) {
      return BearerTokenStatus(context, key, "the inference service (--api-key-file)");
    };
  }
  const google::protobuf::FileDescriptor& file =
      *inference::ModelInferRequest::descriptor()->file();
  auto index = [&file](const char* method) {
    return MethodIndex(file, "GRPCInferenceService", method);
  };
  ServeServerLive(index("ServerLive"));
  ServeServerReady(index("ServerReady"));
  ServeModelReady(index("ModelReady"));
  ServeServerMetadata(index("ServerMetadata"));
  ServeModelMetadata(index("ModelMetadata"));
  ServeModelConfig(index("ModelConfig"));
  ServeModelInfer(index("ModelInfer"));
}

void OipService::ServeServerLive(int index) {
  MarkMethodRawCallback(index, RawMethods::Unary<inference::ServerLiveRequest>(
                                   "ServerLive", metrics_, options_.max_message_bytes, nullptr,
                                   [](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                                      inference::ServerLiveRequest) {
                                     inference::ServerLiveResponse response;
                                     response.set_live(true);
                                     call->Finish(absl::OkStatus(), response);
                                   }));
}

void OipService::ServeServerReady(int index) {
  MarkMethodRawCallback(index,
                        RawMethods::Unary<inference::ServerReadyRequest>(
                            "ServerReady", metrics_, options_.max_message_bytes, nullptr,
                            [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                                   inference::ServerReadyRequest) {
                              inference::ServerReadyResponse response;
                              response.set_ready(serving_.load() && !draining_.load());
                              call->Finish(absl::OkStatus(), response);
                            }));
}

void OipService::ServeModelReady(int index) {
  MarkMethodRawCallback(
      index, RawMethods::Unary<inference::ModelReadyRequest>(
                 "ModelReady", metrics_, options_.max_message_bytes, authorize_,
                 [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                        inference::ModelReadyRequest request) {
                   absl::StatusOr<const ServedModel*> served = core_->models().Find(request.name());
                   absl::Status known = served.status();
                   if (known.ok())
                     known = core_->Resolve((*served)->name, request.version()).status();
                   if (!known.ok()) {
                     call->Finish(known);
                     return;
                   }
                   inference::ModelReadyResponse response;
                   response.set_ready(serving_.load() && !draining_.load());
                   call->Finish(absl::OkStatus(), response);
                 }));
}

void OipService::ServeServerMetadata(int index) {
  MarkMethodRawCallback(
      index, RawMethods::Unary<inference::ServerMetadataRequest>(
                 "ServerMetadata", metrics_, options_.max_message_bytes, authorize_,
                 [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                        inference::ServerMetadataRequest) {
                   const ServerDescription server = DescribeServer(options_.server_version);
                   inference::ServerMetadataResponse response;
                   response.set_name(server.name);
                   response.set_version(server.version);
                   for (const std::string& e : server.extensions) response.add_extensions(e);
                   call->Finish(absl::OkStatus(), response);
                 }));
}

void OipService::ServeModelMetadata(int index) {
  MarkMethodRawCallback(
      index, RawMethods::Unary<inference::ModelMetadataRequest>(
                 "ModelMetadata", metrics_, options_.max_message_bytes, authorize_,
                 [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                        inference::ModelMetadataRequest request) {
                   absl::StatusOr<ModelDescription> model =
                       DescribeModel(core_, request.name(), request.version(), call->Control());
                   if (!model.ok()) {
                     call->Finish(model.status());
                     return;
                   }
                   inference::ModelMetadataResponse response;
                   FillSignature(*model, &response);
                   call->Finish(absl::OkStatus(), response);
                 }));
}

void OipService::ServeModelConfig(int index) {
  MarkMethodRawCallback(
      index, RawMethods::Unary<inference::ModelConfigRequest>(
                 "ModelConfig", metrics_, options_.max_message_bytes, authorize_,
                 [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                        inference::ModelConfigRequest request) {
                   absl::StatusOr<ModelDescription> model =
                       DescribeModel(core_, request.name(), request.version(), call->Control());
                   if (!model.ok()) {
                     call->Finish(model.status());
                     return;
                   }
                   inference::ModelConfigResponse response;
                   FillConfig(*model, response.mutable_config());
                   call->Finish(absl::OkStatus(), response);
                 }));
}

namespace {

void ReplyInfer(UnaryCall& call, const std::string& id, absl::StatusOr<InferResponse> result,
                int64_t max_message_bytes) {
  if (!result.ok()) {
    call.Finish(result.status());
    return;
  }
  inference::ModelInferResponse response;
  response.set_model_name(result->model);
  response.set_model_version(result->version);
  response.set_id(id);
  for (OutputTensor& output : result->outputs) {
    inference::ModelInferResponse::InferOutputTensor* tensor = response.add_outputs();
    tensor->set_name(output.name);
    tensor->set_datatype(output.datatype);
    for (int64_t d : output.shape) tensor->add_shape(d);
    *response.add_raw_output_contents() = std::move(output.raw);
  }
  // The memory the call was admitted with is in use until the bytes are written.
  call.Hold(std::make_shared<std::vector<std::shared_ptr<void>>>(std::move(result->held)));
  call.Finish(CheckResponseSize(response, max_message_bytes), response);
}

}  // namespace

void OipService::ServeModelInfer(int index) {
  MarkMethodRawCallback(
      index, RawMethods::Unary<inference::ModelInferRequest>(
                 "ModelInfer", metrics_, options_.max_message_bytes, authorize_,
                 [this](std::shared_ptr<UnaryCall> call, grpc::CallbackServerContext*,
                        inference::ModelInferRequest request) {
                   if (!serving_.load()) {
                     call->Finish(absl::UnavailableError(
                         "the server is not serving: the model is loading or the server is "
                         "shutting down; retry shortly"));
                     return;
                   }
                   absl::StatusOr<InferRequest> infer = FromProto(request);
                   if (!infer.ok()) {
                     call->Finish(infer.status());
                     return;
                   }
                   const int64_t max_bytes = options_.max_message_bytes;
                   inferrer_.Infer(
                       *infer, call->Control(),
                       [call, id = request.id(), max_bytes](absl::StatusOr<InferResponse> result) {
                         ReplyInfer(*call, id, std::move(result), max_bytes);
                       });
                 },
                 /*answer_dropped=*/true));
}

}  // namespace attn::server::oip
