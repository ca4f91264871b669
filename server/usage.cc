#include "server/usage.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attnserve/v1/encoder.grpc.pb.h"
#include "attnserve/v1/trainer.grpc.pb.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/http/http_routes.h"
#include "server/oip/oip_rest.h"

namespace attn::server {
namespace {

// "Encode, AttentionMap, ...": every method of a service, in the .proto's order.
std::string MethodsOf(const char* service) {
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  std::vector<std::string> methods;
  for (int i = 0; descriptor != nullptr && i < descriptor->method_count(); ++i) {
    methods.push_back(descriptor->method(i)->name());
  }
  return absl::StrJoin(methods, ", ");
}

}  // namespace

std::string ServerUsage() {
  // The HTTP front end's routes, then the Open Inference Protocol's (REST) in one column.
  std::vector<std::pair<std::string, std::string>> rows;  // "METHOD path", what
  for (const http::HttpRoute& route : http::HttpRouteTable()) {
    rows.emplace_back(absl::StrCat(route.method, " ", route.path), route.what);
  }
  for (const oip::OipRoute& route : oip::OipRouteTable()) {
    rows.emplace_back(absl::StrCat(route.method, " ", route.path), route.what);
  }
  size_t width = 0;
  for (const auto& [name, what] : rows) width = std::max(width, name.size());
  std::string routes;
  for (const auto& [name, what] : rows) {
    absl::StrAppend(&routes, "    ", name, std::string(width + 2 - name.size(), ' '), what, "\n");
  }
  return absl::StrCat(
      "serves a BERT-family encoder (embeddings, attention maps, explanations, classification, "
      "reranking) and, with --trainer-token-file, fine-tunes it.\n\n"
      "gRPC (--port):\n    ",
      attnserve::v1::Encoder::service_full_name(), ": ",
      MethodsOf(attnserve::v1::Encoder::service_full_name()), "\n    ",
      attnserve::v1::Trainer::service_full_name(),
      " (needs --trainer-token-file): ", MethodsOf(attnserve::v1::Trainer::service_full_name()),
      "\n    ", inference::GRPCInferenceService::service_full_name(),
      " (the Open Inference Protocol: KServe v2, Triton clients): ",
      MethodsOf(inference::GRPCInferenceService::service_full_name()),
      "\n    grpc.health.v1.Health, grpc.reflection.v1alpha.ServerReflection\n"
      "HTTP/JSON (--http-port; the Encoder calls in protobuf's JSON mapping; NAME a model, V "
      "a version):\n",
      routes,
      "Prometheus (--metrics-port): GET /metrics\n\n"
      "Example: attnserve --port 50051 --http-port 8080 --metrics-port 9464\n"
      "Several models: attnserve --model minilm=models/all-MiniLM-L6-v2 "
      "--model mpnet=models/all-mpnet-base-v2 (the first is the default; requests pick one "
      "with their `model` field)");
}

}  // namespace attn::server
