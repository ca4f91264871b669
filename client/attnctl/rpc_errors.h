// How attnctl reports a failed call: the server's message in attnctl's own terms (its flags,
// not the request's fields; lines of stdin, not indexes of one request), and what to do about
// it (a missing or wrong API key or token, attnctl pointed at attnserve's HTTP or metrics port).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attn::client::attnctl {

// Names the input at index `k` of the request in messages ("line 12 of stdin", "--text").
using InputNamer = std::function<std::string(int k)>;

// "attnctl: cannot reach <target> (CODE): ..." or "attnctl: CODE: message" in attnctl's terms
// (InAttnctlTerms), then a hint where there is one; returns kExitFailure. For the Encoder's
// commands (the API key's hints).
int RpcError(const absl::Status& status, const std::string& target,
             const InputNamer& inputs = nullptr);
// The same, with what to do about the errors specific to the Trainer (its token, a server
// without the Trainer); returns kExitFailure.
int TrainerRpcError(const absl::Status& status, const std::string& target);

// The server's message in attnctl's terms: "inputs[k]" as `inputs` names it (when set), the
// request's fields as the flags that set them (tokenization.max_length: --max-length,
// TRUNCATION_NONE: --truncation none, LONG_TEXT_CHUNK: --long-text chunk).
std::string InAttnctlTerms(absl::string_view message, const InputNamer& inputs);

// What to do about an input over the length limit, from the server's message ("" when the
// message is not about that): raise --max-length when the model can take the input, else say
// that no --max-length can, and what can (--long-text chunk when this attnctl has it).
std::string OverLengthHint(absl::string_view message);

}  // namespace attn::client::attnctl
