// attnserve --help's header: what the server serves, listed from the same tables the server
// registers from (the gRPC services' descriptors, whose generated services register every
// method, and the HTTP route table), so the help cannot fall behind the server.
#pragma once

#include <string>

namespace attn::server {

std::string ServerUsage();

}  // namespace attn::server
