// attnserve.v1 messages <-> the serving core's structs (server/core/calls.h). Requests are
// converted to views into the message, which must outlive the core call's entry point.
#pragma once

#include "attnserve/v1/encoder.pb.h"
#include "server/core/calls.h"

namespace attn::server {

core::TokenizationOptions ToCore(const attnserve::v1::TokenizationOptions& options);
core::EncodeRequest ToCore(const attnserve::v1::EncodeRequest& request);
core::AttentionRequest ToCore(const attnserve::v1::AttentionMapRequest& request);
core::TokenizeRequest ToCore(const attnserve::v1::TokenizeRequest& request);
core::ModelInfoRequest ToCore(const attnserve::v1::GetModelInfoRequest& request);
core::ExplainRequest ToCore(const attnserve::v1::ExplainRequest& request);
core::ClassifyRequest ToCore(const attnserve::v1::ClassifyRequest& request);
core::RerankRequest ToCore(const attnserve::v1::RerankRequest& request);

void ToProto(const core::EncodeResponse& response, attnserve::v1::EncodeResponse* out);
void ToProto(const core::AttentionResponse& response, attnserve::v1::AttentionMapResponse* out);
void ToProto(const core::TokenizeResponse& response, attnserve::v1::TokenizeResponse* out);
void ToProto(const core::ModelInfo& info, attnserve::v1::ModelInfo* out);
void ToProto(const core::ExplainResponse& response, attnserve::v1::ExplainResponse* out);
void ToProto(const core::ClassifyResponse& response, attnserve::v1::ClassifyResponse* out);
void ToProto(const core::RerankResponse& response, attnserve::v1::RerankResponse* out);

}  // namespace attn::server
