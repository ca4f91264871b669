// What answers HTTP/1.x on a port where a gRPC call failed: attnctl pointed at attnserve's HTTP
// port (whose /health names the gRPC port) or its metrics port gets told so, instead of gRPC's
// "Trying to connect an http1.x server".
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace attn::client::attnctl {

struct HttpAnswer {
  int status = 0;
  std::string body;  // at most 64 KiB
};

// A plain-text HTTP/1.0 GET of `path` from `target` ("host:port" or "[v6]:port"; anything else,
// such as a gRPC URI scheme, is not probed); nullopt when no HTTP answer came within `timeout`.
std::optional<HttpAnswer> HttpProbe(const std::string& target, const std::string& path,
                                    std::chrono::milliseconds timeout);

// attnctl's explanation for a gRPC call to `target` that found an HTTP/1.x server there, from
// probing it: attnserve's HTTP port (and where its gRPC port is), its metrics port, or an HTTP
// server that is not attnserve's.
std::string ExplainHttpPort(const std::string& target);

}  // namespace attn::client::attnctl
