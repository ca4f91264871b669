// attnctl: command-line client for attnserve.
//
//   attnctl encode|attention|tokenize|info|health [flags]
//   attnctl finetune|versions|rollback|serve-version [flags]
//
// Human-readable output by default, --json for machine output. Exit status: 0 ok, 1 RPC or I/O
// failure (health: also "not SERVING"), 2 usage error (finetune: also a bad data file), 128+N
// when finetune was stopped by signal N (Ctrl-C: 130) and aborted the job.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/render.h"
#include "client/tensor_decode.h"
#include "client/training_data.h"
#include "engine/cli_util.h"
#include "google/protobuf/util/json_util.h"

// Common.
ABSL_FLAG(std::string, server, "",
          "Server address host:port (default: $ATTNSERVE_ADDR, else localhost:50051)");
ABSL_FLAG(int, timeout_ms, 30000, "Per-call deadline in milliseconds (0 = none)");
ABSL_FLAG(bool, wait_for_ready, false,
          "Wait (up to the deadline) for the server to come up instead of failing fast");
ABSL_FLAG(bool, json, false, "Print the response as JSON, one line per response");
ABSL_FLAG(std::string, model_version, "", "Model version to use (default: the served one)");
// Inputs.
ABSL_FLAG(std::string, text, "", "Input text; without it, one text per line is read from stdin");
ABSL_FLAG(std::string, pair, "", "Second text of a pair with --text");
ABSL_FLAG(int, max_length, 0, "Max tokens per input incl. [CLS]/[SEP] (0 = model default)");
ABSL_FLAG(std::string, truncation, "", "right | left | none (default: right)");
// encode.
ABSL_FLAG(std::string, pooling, "default", "cls | mean | max | none | default");
ABSL_FLAG(std::string, normalize, "default",
          "L2-normalise the pooled embedding: true|false|default");
ABSL_FLAG(std::vector<std::string>, layers, {},
          "Hidden-state layers to return, e.g. 0,-1 (0 = embedding output, -1 = last layer)");
ABSL_FLAG(std::string, dtype, "float32", "Tensor dtype on the wire: float32 | float16 | bfloat16");
// attention.
ABSL_FLAG(int, layer, -1, "Encoder layer, 0-based; negative counts from the end (-1 = last)");
ABSL_FLAG(int, head, -1, "Attention head, 0-based (default -1: all heads)");
ABSL_FLAG(std::string, svg, "", "Write the picture as SVG to this path");
ABSL_FLAG(std::string, html, "", "Write a self-contained HTML page to this path");
ABSL_FLAG(bool, rollout, false, "Show attention rollout through all layers instead of a head");
ABSL_FLAG(bool, mean, false, "Show the mean over the layer's heads instead of a head");
ABSL_FLAG(int, top, 3, "Attended tokens printed per row (text output)");
// health.
ABSL_FLAG(std::string, service, "", "Service name to check (default \"\": the whole server)");
// Trainer commands.
ABSL_FLAG(std::string, token_file, "",
          "File holding the Trainer's bearer token (default: $ATTNSERVE_TOKEN)");
// finetune.
ABSL_FLAG(std::string, data, "", "Training data: a JSON Lines file, one example per line");
ABSL_FLAG(std::string, objective, "", "contrastive | cosine | classification");
ABSL_FLAG(int, epochs, 1, "Passes over the data");
ABSL_FLAG(double, lr, 2e-5, "Peak learning rate (AdamW)");
ABSL_FLAG(int, batch_size, 16, "Examples per optimisation step");
ABSL_FLAG(int64_t, warmup_steps, 0, "Linear warm-up steps before the linear decay to 0");
ABSL_FLAG(int, num_labels, 0,
          "classification: number of classes (default: the largest label in the data + 1)");
ABSL_FLAG(std::string, parameters, "all", "all | attention | all-but-embeddings | head");
ABSL_FLAG(uint64_t, seed, 0, "Seeds the per-epoch shuffle, dropout and the head initialisation");
ABSL_FLAG(bool, no_dropout, false, "Train without dropout");
ABSL_FLAG(std::string, base_version, "", "Version to start from (default: the served one)");
ABSL_FLAG(bool, commit, false, "Publish the result as a new version and serve it by default");
ABSL_FLAG(std::string, description, "", "Free text stored with the committed version");
ABSL_FLAG(int, log_every, 0, "Without a terminal: a progress line every N steps (0 = ~20 lines)");
ABSL_FLAG(bool, dry_run, false, "Check the data and print the plan; do not connect");

namespace attn::client {
namespace {

namespace v1 = ::attnserve::v1;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// ---------------------------------------------------------------------------------------------
// Usage text

constexpr char kTopUsage[] =
    R"(attnctl: command-line client for attnserve (a BERT encoder served over gRPC).

Usage: attnctl <command> [flags]

Commands:
  encode      sentence embeddings (and hidden states of chosen layers) of texts
  attention   attention maps of a layer: top attended tokens, or SVG/HTML pictures
  tokenize    tokens, ids, segment ids and character offsets
  info        the served model: architecture, sizes, defaults, versions
  health      grpc.health.v1 check; exits 0 only if SERVING (for Docker HEALTHCHECK)

Fine-tuning and versions (Trainer service; token from --token-file PATH or $ATTNSERVE_TOKEN):
  finetune       fine-tune on a JSON Lines file, with live progress; --commit publishes it
  versions       committed model versions and which one is served
  rollback       serve the version before the current one (or --version V)
  serve-version  serve --version V by default

Common flags:
  --server HOST:PORT    server address (default: $ATTNSERVE_ADDR, else localhost:50051)
  --timeout-ms N        per-call deadline in milliseconds (default 30000; 0 = none)
  --wait-for-ready      wait for the server to come up instead of failing fast
  --json                print the response as JSON (one line per response)
  --model-version V     use this model version (default: the one being served)

Inputs (encode, attention, tokenize):
  --text TEXT           the input text; without --text, one text per line is read from stdin
  --pair TEXT           second text of a pair: [CLS] text [SEP] pair [SEP]
  --max-length N        max tokens incl. [CLS]/[SEP] (default 0 = the model's default)
  --truncation MODE     right (default) | left | none

Examples:
  attnctl info --server localhost:50051
  attnctl encode --text "The cat sat on the mat."
  printf 'first text\nsecond text\n' | attnctl encode --json
  attnctl tokenize --text "Don't panic!" --pair "Why not?"
  attnctl attention --text "The cat sat on the mat." --layer 2 --head 5
  attnctl attention --text "The cat sat on the mat." --html attention.html
  attnctl health --server localhost:50051 --timeout-ms 2000 || echo unhealthy
  attnctl finetune --data pairs.jsonl --objective contrastive --epochs 2 --commit
  attnctl versions

Run 'attnctl <command> --help' for the flags of a command. Flag names may be written with
dashes or underscores (--timeout-ms = --timeout_ms).
Exit status: 0 ok, 1 RPC or I/O error (health: not SERVING), 2 usage error (finetune: also a
bad data file), 130 finetune interrupted by Ctrl-C (the job was aborted).
)";

constexpr char kCommonFlagsHelp[] =
    R"(Common flags:
  --server HOST:PORT    server address (default: $ATTNSERVE_ADDR, else localhost:50051)
  --timeout-ms N        per-call deadline in milliseconds (default 30000; 0 = none)
  --wait-for-ready      wait for the server to come up instead of failing fast
  --json                print the response as JSON (one line per response)
)";

constexpr char kInputFlagsHelp[] =
    R"(Inputs:
  --text TEXT           the input text; without --text, one text per line is read from stdin
                        (empty lines skipped), each line one input of the batch
  --pair TEXT           second text of a pair with --text: [CLS] text [SEP] pair [SEP]
  --max-length N        max tokens incl. [CLS]/[SEP] (default 0 = the model's default)
  --truncation MODE     right (default: keep the beginning) | left | none (error if too long)
  --model-version V     use this model version (default: the one being served)
)";

struct Command {
  const char* name;
  const char* usage;
  // Flags the command reads besides the common ones.
  std::vector<std::string> flags;
  bool takes_inputs;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"encode",
       R"(attnctl encode: pooled sentence embeddings (and hidden states) of texts.

Usage: attnctl encode [--text TEXT [--pair TEXT] | < lines] [flags]

Prints per input its token count, the embedding's L2 norm and first 8 dimensions, and for each
--layers entry the hidden-state shape and the first 8 values of the [CLS] row.

Flags:
  --pooling P           cls | mean | max | none | default (the model's: mean for MiniLM)
  --normalize B         true | false | default (the model's: true for MiniLM)
  --layers L,L,...      also return per-token hidden states of these layers: 0 = embedding
                        output, i = encoder layer i, negative counts from the end (-1 = last)
  --dtype D             wire dtype of hidden states: float32 (default) | float16 | bfloat16

Examples:
  attnctl encode --text "The cat sat on the mat."
  attnctl encode --text "A man is eating." --pair "Someone eats." --pooling cls
  attnctl encode --text "hello" --layers 0,-1 --dtype bfloat16
  cat sentences.txt | attnctl encode --json > embeddings.jsonl
)",
       {"pooling", "normalize", "layers", "dtype"},
       true},
      {"attention",
       R"(attnctl attention: attention maps of one layer.

Usage: attnctl attention [--text TEXT [--pair TEXT] | < lines] [flags]

Rows are query tokens (attending from), columns key tokens (attended to). Without --svg/--html
it prints, per row, the most attended tokens of the chosen map (default: the mean over heads
when no --head is given). With --svg/--html it draws the map: one head (--head), the mean over
heads (--mean), attention rollout through all layers (--rollout), or by default a grid with
every head of the layer.

Flags:
  --layer N             encoder layer, 0-based; negative counts from the end (default -1: last)
  --head H              one head, 0-based (default: all heads)
  --mean                the mean over the layer's heads
  --rollout             attention rollout (Abnar & Zuidema 2020) through all layers
  --svg PATH            write an SVG picture (several inputs: PATH-0.svg, PATH-1.svg, ...)
  --html PATH           write one self-contained HTML page with a picture per input
  --top K               attended tokens printed per row (default 3)
  --dtype D             wire dtype: float32 (default) | float16 | bfloat16

Examples:
  attnctl attention --text "The cat sat on the mat." --head 3
  attnctl attention --text "The cat sat on the mat." --layer 0 --svg heads.svg
  attnctl attention --text "The bank of the river." --rollout --html rollout.html
)",
       {"layer", "head", "svg", "html", "rollout", "mean", "top", "dtype"},
       true},
      {"tokenize",
       R"(attnctl tokenize: tokens exactly as the encoder sees them.

Usage: attnctl tokenize [--text TEXT [--pair TEXT] | < lines] [flags]

Prints a table per input: position, token, vocabulary id, segment (type) id, the token's
[start, end) character offsets into its text and the text they cover.

Examples:
  attnctl tokenize --text "Tokenization isn't trivial."
  attnctl tokenize --text "How old are you?" --pair "I am 6." --max-length 8
)",
       {},
       true},
      {"info",
       R"(attnctl info: what model the server is serving.

Usage: attnctl info [flags]

Prints the model's architecture, sizes, defaults and versions as "key: value" lines.

Flags:
  --model-version V     describe this version (default: the one being served)

Examples:
  attnctl info
  attnctl info --json
)",
       {},
       false},
      {"health",
       R"(attnctl health: grpc.health.v1 check.

Usage: attnctl health [--service NAME] [flags]

Prints SERVING, NOT_SERVING, UNKNOWN or SERVICE_UNKNOWN and exits 0 only for SERVING, so it can
be a Docker HEALTHCHECK or a Kubernetes exec probe.

Flags:
  --service NAME        service to check (default "": the server as a whole; for example
                        attnserve.v1.Encoder)

Examples:
  attnctl health
  HEALTHCHECK CMD ["attnctl", "health", "--timeout-ms", "2000"]
)",
       {"service"},
       false},
      {"finetune",
       R"(attnctl finetune: fine-tune the served model on a JSON Lines file.

Usage: attnctl finetune --data FILE --objective OBJ [flags]

The file is checked completely before connecting (errors name file:line). Examples are
shuffled every epoch (--seed), sent in batches of --batch-size, one optimisation step per
batch; the server's learning rate warms up over --warmup-steps, then decays linearly to 0 at
the last step (ceil(examples / batch-size) x epochs). Progress goes to stderr: a live bar on a
terminal, else a line every --log-every steps. Without --commit the trained weights are
discarded at the end (watch the loss first); with --commit they become a new version,
served by default. Ctrl-C aborts the job (nothing is published, serving is unchanged).

Data, one JSON object per line (other fields ignored, blank lines skipped):
  contrastive       {"anchor": "...", "positive": "...", "negative": "..."}
                    (negative optional: on every line or on none; in-batch negatives, so
                    larger batches help)
  cosine            {"first": "...", "second": "...", "score": 0.8}   score in [-1, 1]
  classification    {"text": "...", "label": 2}   label in [0, num-labels)

Flags:
  --data FILE           training data (JSON Lines), required
  --objective OBJ       contrastive | cosine | classification, required
  --epochs N            passes over the data (default 1)
  --lr X                peak learning rate, AdamW (default 2e-5)
  --batch-size N        examples per step (default 16; at most the server's
                        --max-inputs-per-request)
  --warmup-steps N      linear warm-up steps (default 0)
  --num-labels K        classification: classes (default: largest label in the data + 1)
  --parameters P        what is trained: all (default) | attention (Q, K, V, O) |
                        all-but-embeddings | head (classification head only)
  --seed S              shuffle order, dropout masks, head initialisation (default 0)
  --no-dropout          train without dropout
  --max-length N        max tokens per text (default: the model's); --truncation MODE
  --base-version V      start from this version (default: the served one)
  --commit              publish the result as a new version and serve it by default
  --description TEXT    stored with the committed version (with --commit)
  --token-file PATH     file with the Trainer token (default: $ATTNSERVE_TOKEN)
  --log-every N         without a terminal: a progress line every N steps (default: ~20 lines)
  --json                every progress message as a JSON line on stdout
  --dry-run             check the data, print the plan, do not connect
  --timeout-ms N        longest wait for the server's next message (default 30000; 0 = none)

Examples:
  attnctl finetune --data pairs.jsonl --objective contrastive --epochs 2 --lr 2e-5 \
      --batch-size 16 --warmup-steps 10 --commit --description "support FAQ pairs"
  attnctl finetune --data sts.jsonl --objective cosine --dry-run
  attnctl finetune --data intents.jsonl --objective classification --num-labels 5 --json
)",
       {"data", "objective", "epochs", "lr", "batch_size", "warmup_steps", "num_labels",
        "parameters", "seed", "no_dropout", "base_version", "commit", "description", "token_file",
        "log_every", "dry_run", "max_length", "truncation"},
       false},
      {"versions",
       R"(attnctl versions: committed model versions.

Usage: attnctl versions [flags]

Prints a table, oldest first: version, creation time (UTC), origin (the loaded directory, or
the base version, objective and steps of a fine-tune) and description; '*' marks the version
served by default.

Flags:
  --token-file PATH     file with the Trainer token (default: $ATTNSERVE_TOKEN)

Examples:
  attnctl versions
  attnctl versions --json
)",
       {"token_file"},
       false},
      {"rollback",
       R"(attnctl rollback: serve an earlier version by default.

Usage: attnctl rollback [--version V] [flags]

Without --version: the version committed before the one served now. Prints the new serving
version and the versions table. Requests that pin a version keep it.

Flags:
  --version V           serve this (older) version instead
  --token-file PATH     file with the Trainer token (default: $ATTNSERVE_TOKEN)

Examples:
  attnctl rollback
  attnctl rollback --version base
)",
       {"token_file", "model_version"},
       false},
      {"serve-version",
       R"(attnctl serve-version: serve a committed version by default.

Usage: attnctl serve-version --version V [flags]

Prints the new serving version and the versions table.

Flags:
  --version V           the version to serve, required (see 'attnctl versions')
  --token-file PATH     file with the Trainer token (default: $ATTNSERVE_TOKEN)

Examples:
  attnctl serve-version --version ft-000002-20261122T041900Z
)",
       {"token_file", "model_version"},
       false},
  };
  return *commands;
}

// rollback and serve-version take the version as --version, which is Abseil's own flag
// (print the program version). For them, --version V is rewritten to --model_version V.
bool TakesVersionFlag(const Command& command) {
  return command.name == std::string("rollback") || command.name == std::string("serve-version");
}

const Command* FindCommand(absl::string_view name) {
  for (const Command& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintCommandUsage(const Command& command, FILE* out) {
  std::fputs(command.usage, out);
  std::fputs("\n", out);
  std::fputs(kCommonFlagsHelp, out);
  if (command.takes_inputs) {
    std::fputs("\n", out);
    std::fputs(kInputFlagsHelp, out);
  }
}

int UsageError(const std::string& message, const Command* command = nullptr) {
  std::fprintf(stderr, "attnctl: %s\n", message.c_str());
  if (command != nullptr) {
    std::fprintf(stderr, "Run 'attnctl %s --help' for usage.\n", command->name);
  } else {
    std::fprintf(stderr, "Run 'attnctl --help' for usage.\n");
  }
  return kExitUsage;
}

// ---------------------------------------------------------------------------------------------
// Command line

// Abseil's own flags (help, flagfile, ...): always allowed, handled by ParseCommandLine.
bool IsAbseilBuiltinFlag(absl::string_view name) {
  static const std::set<absl::string_view> kBuiltins = {
      "flagfile",  "fromenv",     "tryfromenv", "undefok",   "help",    "helpfull",
      "helpshort", "helppackage", "helpon",     "helpmatch", "version", "only_check_args"};
  return kBuiltins.count(name) > 0;
}

bool IsCommonFlag(absl::string_view name) {
  return name == "server" || name == "timeout_ms" || name == "wait_for_ready" || name == "json";
}

bool CommandTakesFlag(const Command& command, absl::string_view name) {
  if (IsCommonFlag(name)) return true;
  if (name == "model_version" &&
      (command.takes_inputs || command.name == std::string("info") || TakesVersionFlag(command))) {
    return true;
  }
  if (command.takes_inputs &&
      (name == "text" || name == "pair" || name == "max_length" || name == "truncation")) {
    return true;
  }
  return std::find(command.flags.begin(), command.flags.end(), name) != command.flags.end();
}

// Checks every flag before absl::ParseCommandLine sees them, so unknown flags, flags that do not
// apply to the command and unparsable values are usage errors (exit 2) with a helpful message;
// Abseil would exit 1. `original` holds argv before AcceptDashedFlagNames: a value given as a
// separate argument ("--text -a-b") is restored from it, as dash rewriting must only touch
// flag names. Returns the command, or nullptr after printing the error (exit code in
// `*error_exit`).
const Command* ValidateCommandLine(int argc, char** argv, const std::vector<std::string>& original,
                                   int* error_exit) {
  const Command* command = nullptr;
  std::vector<std::string> seen;  // our flags on the command line, checked against the command
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        *error_exit = UsageError(absl::StrCat("unexpected argument '", argv[i + 1],
                                              "'; give texts with --text or on stdin"));
        return nullptr;
      }
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") {
      if (command == nullptr) {
        command = FindCommand(arg);
        if (command == nullptr) {
          *error_exit = UsageError(absl::StrCat("unknown command '", arg, "'"));
          return nullptr;
        }
      } else {
        *error_exit =
            UsageError(command->takes_inputs ? absl::StrCat("unexpected argument '", arg,
                                                            "'; give texts with --text or on stdin")
                                             : absl::StrCat("unexpected argument '", arg, "'; '",
                                                            command->name, "' takes flags only"),
                       command);
        return nullptr;
      }
      continue;
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name(body.substr(0, eq));
    const bool has_value = eq != absl::string_view::npos;
    if (IsAbseilBuiltinFlag(name)) {
      if (!has_value && name != "help" && name != "helpfull" && name != "helpshort" &&
          name != "helppackage" && name != "version" && name != "only_check_args" && i + 1 < argc) {
        ++i;  // "--flagfile PATH"
      }
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string flag_name = name;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      // "--nojson" negates a boolean flag.
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && !has_value) {
        flag = negated;
        flag_name = name.substr(2);
      }
    }
    if (flag == nullptr) {
      *error_exit = UsageError(absl::StrCat("unknown flag --", name), command);
      return nullptr;
    }
    seen.push_back(flag_name);
    std::string value;
    if (has_value) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;  // "--json", "--nojson"
    } else if (i + 1 < argc) {
      ++i;
      // Undo the dash rewriting on a separate value argument.
      std::strcpy(argv[i], original[i].c_str());
      value = argv[i];
    } else {
      *error_exit = UsageError(absl::StrCat("flag --", name, " needs a value"), command);
      return nullptr;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      *error_exit = UsageError(
          absl::StrCat("invalid value '", value, "' for --", flag_name, ": ", error), command);
      return nullptr;
    }
  }
  if (command == nullptr) {
    *error_exit = UsageError(
        "missing command (encode, attention, tokenize, info, health, finetune, versions, "
        "rollback or serve-version)");
    return nullptr;
  }
  for (const std::string& name : seen) {
    if (!CommandTakesFlag(*command, name)) {
      *error_exit = UsageError(
          absl::StrCat("flag --", name, " does not apply to '", command->name, "'"), command);
      return nullptr;
    }
  }
  return command;
}

// ---------------------------------------------------------------------------------------------
// Helpers

std::string ServerAddress() {
  std::string server = absl::GetFlag(FLAGS_server);
  if (!server.empty()) return server;
  const char* env = std::getenv("ATTNSERVE_ADDR");
  if (env != nullptr && *env != '\0') return env;
  return "localhost:50051";
}

ClientOptions OptionsFromFlags() {
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(std::max(0, absl::GetFlag(FLAGS_timeout_ms)));
  options.wait_for_ready = absl::GetFlag(FLAGS_wait_for_ready);
  return options;
}

int RpcError(const absl::Status& status, const std::string& target) {
  const std::string code = absl::StatusCodeToString(status.code());
  if (IsUnreachable(status)) {
    std::fprintf(stderr, "attnctl: cannot reach %s (%s): %s\n", target.c_str(), code.c_str(),
                 std::string(status.message()).c_str());
  } else {
    std::fprintf(stderr, "attnctl: %s: %s\n", code.c_str(), std::string(status.message()).c_str());
  }
  return kExitFailure;
}

bool PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    std::fprintf(stderr, "attnctl: cannot print JSON: %s\n", status.ToString().c_str());
    return false;
  }
  std::printf("%s\n", json.c_str());
  return true;
}

// Number of code points: a good enough display width for aligning columns.
int DisplayWidth(absl::string_view s) {
  int n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string PadRight(absl::string_view s, int width) {
  std::string out(s);
  out.append(std::max(0, width - DisplayWidth(s)), ' ');
  return out;
}

// Code points [begin, end) of a UTF-8 string (offsets as the server reports them).
std::string CodePointSlice(absl::string_view s, int begin, int end) {
  std::string out;
  int cp = -1;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++cp;
    if (cp >= end) break;
    if (cp >= begin) out.push_back(c);
  }
  return out;
}

// A one-line, length-limited rendering of an input text for headings.
std::string ShortText(absl::string_view text, int max_chars = 60) {
  std::string flat;
  for (char c : text) flat.push_back(c == '\n' || c == '\t' || c == '\r' ? ' ' : c);
  if (DisplayWidth(flat) <= max_chars) return flat;
  return CodePointSlice(flat, 0, max_chars - 1) + "\u2026";
}

// The texts of one input, for printing (token offsets index into them).
struct InputText {
  std::string first;
  std::string second;  // empty unless a pair
  bool is_pair = false;
  std::string Describe() const {
    if (!is_pair) return absl::StrCat("\"", ShortText(first), "\"");
    return absl::StrCat("\"", ShortText(first, 40), "\" + \"", ShortText(second, 40), "\"");
  }
};

absl::StatusOr<std::vector<InputText>> ReadInputs() {
  std::vector<InputText> inputs;
  const std::string text = absl::GetFlag(FLAGS_text);
  const std::string pair = absl::GetFlag(FLAGS_pair);
  if (!text.empty()) {
    inputs.push_back({text, pair, !pair.empty()});
    return inputs;
  }
  if (!pair.empty()) return absl::InvalidArgumentError("--pair needs --text");
  // An interactive terminal would wait forever for a text nobody knows to type.
  if (isatty(STDIN_FILENO)) {
    return absl::InvalidArgumentError("no input: give --text TEXT or pipe one text per line");
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    inputs.push_back({line, "", false});
  }
  if (inputs.empty()) {
    return absl::InvalidArgumentError("no input: stdin had no text (one text per line)");
  }
  return inputs;
}

void FillInputs(const std::vector<InputText>& texts,
                google::protobuf::RepeatedPtrField<v1::Input>* inputs) {
  for (const InputText& t : texts) {
    v1::Input* input = inputs->Add();
    if (t.is_pair) {
      input->mutable_pair()->set_first(t.first);
      input->mutable_pair()->set_second(t.second);
    } else {
      input->set_text(t.first);
    }
  }
}

absl::StatusOr<v1::TokenizationOptions> TokenizationFromFlags() {
  v1::TokenizationOptions options;
  const int max_length = absl::GetFlag(FLAGS_max_length);
  if (max_length < 0) return absl::InvalidArgumentError("--max-length must be >= 0");
  options.set_max_length(max_length);
  const std::string mode = absl::AsciiStrToLower(absl::GetFlag(FLAGS_truncation));
  if (mode.empty()) {
    options.set_truncation(v1::TRUNCATION_UNSPECIFIED);
  } else if (mode == "right") {
    options.set_truncation(v1::TRUNCATION_RIGHT);
  } else if (mode == "left") {
    options.set_truncation(v1::TRUNCATION_LEFT);
  } else if (mode == "none") {
    options.set_truncation(v1::TRUNCATION_NONE);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--truncation must be right, left or none, not '", mode, "'"));
  }
  return options;
}

absl::StatusOr<v1::DType> DTypeFromFlag() {
  const std::string d = absl::AsciiStrToLower(absl::GetFlag(FLAGS_dtype));
  if (d == "float32" || d == "fp32" || d == "f32") return v1::FLOAT32;
  if (d == "float16" || d == "fp16" || d == "f16" || d == "half") return v1::FLOAT16;
  if (d == "bfloat16" || d == "bf16") return v1::BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be float32, float16 or bfloat16, not '", d, "'"));
}

std::string FormatFloats(const float* values, int n) {
  std::vector<std::string> parts;
  for (int i = 0; i < n; ++i) parts.push_back(absl::StrFormat("%+.4f", values[i]));
  return absl::StrJoin(parts, " ");
}

std::string TruncationNote(bool truncated, int untruncated_length) {
  if (!truncated) return "";
  return absl::StrFormat(", truncated from %d", untruncated_length);
}

void PrintMetadata(const std::string& version, const v1::ResponseMetadata& m) {
  std::printf(
      "model %s: %lld tokens, %.2f ms total (tokenize %.2f, queue %.2f, inference %.2f; batch "
      "of %d inputs)\n",
      version.c_str(), static_cast<long long>(m.token_count()), m.total_ms(), m.tokenization_ms(),
      m.queue_ms(), m.inference_ms(), m.batch_inputs());
}

// The fields EncodeRequest and AttentionMapRequest share, from the inputs and flags; returns the
// inputs (their descriptions label the output).
template <typename Request>
absl::StatusOr<std::vector<InputText>> FillSharedRequestFields(Request* request) {
  auto texts = ReadInputs();
  if (!texts.ok()) return texts.status();
  FillInputs(*texts, request->mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return tokenization.status();
  *request->mutable_tokenization() = *tokenization;
  auto dtype = DTypeFromFlag();
  if (!dtype.ok()) return dtype.status();
  request->set_output_dtype(*dtype);
  request->set_model_version(absl::GetFlag(FLAGS_model_version));
  return texts;
}

// ---------------------------------------------------------------------------------------------
// encode

int RunEncode(EncoderClient& client, const Command& command) {
  v1::EncodeRequest request;
  auto texts = FillSharedRequestFields(&request);
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);

  const std::string pooling = absl::AsciiStrToLower(absl::GetFlag(FLAGS_pooling));
  if (pooling == "default") {
    request.set_pooling(v1::POOLING_MODEL_DEFAULT);
  } else if (pooling == "cls") {
    request.set_pooling(v1::POOLING_CLS);
  } else if (pooling == "mean") {
    request.set_pooling(v1::POOLING_MEAN);
  } else if (pooling == "max") {
    request.set_pooling(v1::POOLING_MAX);
  } else if (pooling == "none") {
    request.set_pooling(v1::POOLING_NONE);
  } else {
    return UsageError(
        absl::StrCat("--pooling must be cls, mean, max, none or default, not '", pooling, "'"),
        &command);
  }
  const std::string normalize = absl::AsciiStrToLower(absl::GetFlag(FLAGS_normalize));
  if (normalize == "true") {
    request.set_normalize(true);
  } else if (normalize == "false") {
    request.set_normalize(false);
  } else if (normalize != "default") {
    return UsageError(
        absl::StrCat("--normalize must be true, false or default, not '", normalize, "'"),
        &command);
  }
  for (const std::string& s : absl::GetFlag(FLAGS_layers)) {
    int layer = 0;
    if (!absl::SimpleAtoi(s, &layer)) {
      return UsageError(absl::StrCat("--layers takes integers like 0,-1, not '", s, "'"), &command);
    }
    request.add_hidden_layers(layer);
  }

  auto response = client.Encode(request);
  if (!response.ok()) return RpcError(response.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;

  int status = kExitOk;
  for (int i = 0; i < response->results_size(); ++i) {
    const v1::EncodeResult& r = response->results(i);
    const std::string what = i < static_cast<int>(texts->size()) ? (*texts)[i].Describe() : "";
    std::printf("[%d] %s (%d tokens%s)\n", i, what.c_str(), r.tokens_size(),
                TruncationNote(r.truncated(), r.untruncated_length()).c_str());
    if (r.embedding_size() > 0) {
      double sq = 0;
      for (float v : r.embedding()) sq += static_cast<double>(v) * v;
      const int n = std::min(8, r.embedding_size());
      std::printf("    embedding [%d] norm %.4f: %s%s\n", r.embedding_size(), std::sqrt(sq),
                  FormatFloats(r.embedding().data(), n).c_str(),
                  r.embedding_size() > n ? " ..." : "");
    }
    for (const v1::LayerTensor& layer : r.hidden_states()) {
      auto tensor = DecodeTensor(layer.tensor());
      if (!tensor.ok()) {
        std::fprintf(stderr, "attnctl: input %d layer %d: bad tensor from server: %s\n", i,
                     layer.layer(), std::string(tensor.status().message()).c_str());
        status = kExitFailure;
        continue;
      }
      const std::string shape = absl::StrJoin(tensor->shape, " x ");
      const int n = static_cast<int>(
          std::min<int64_t>(8, tensor->rank() == 2 ? tensor->dim(1) : tensor->size()));
      std::printf("    layer %d [%s] %s, [CLS] row: %s%s\n", layer.layer(), shape.c_str(),
                  v1::DType_Name(layer.tensor().dtype()).c_str(),
                  FormatFloats(tensor->values.data(), n).c_str(), tensor->size() > n ? " ..." : "");
    }
  }
  PrintMetadata(response->model_version(), response->metadata());
  return status;
}

// ---------------------------------------------------------------------------------------------
// tokenize

int RunTokenize(EncoderClient& client, const Command& command) {
  v1::TokenizeRequest request;
  auto texts = ReadInputs();
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  FillInputs(*texts, request.mutable_inputs());
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return UsageError(std::string(tokenization.status().message()), &command);
  *request.mutable_tokenization() = *tokenization;
  request.set_model_version(absl::GetFlag(FLAGS_model_version));

  auto response = client.Tokenize(request);
  if (!response.ok()) return RpcError(response.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;

  for (int i = 0; i < response->results_size(); ++i) {
    const v1::TokenizeResult& r = response->results(i);
    const InputText* input = i < static_cast<int>(texts->size()) ? &(*texts)[i] : nullptr;
    std::printf("[%d] %s (%d tokens%s)\n", i, input ? input->Describe().c_str() : "",
                r.tokens_size(), TruncationNote(r.truncated(), r.untruncated_length()).c_str());
    const std::vector<std::string> header = {"#", "token", "id", "type", "chars", "text"};
    std::vector<std::vector<std::string>> rows;
    for (int k = 0; k < r.tokens_size(); ++k) {
      const v1::Token& t = r.tokens(k);
      std::string span = "-";
      std::string covered;
      if (!t.special()) {
        span = absl::StrFormat("%d-%d", t.char_start(), t.char_end());
        if (input != nullptr) {
          const std::string& source = t.source() == 1 ? input->second : input->first;
          covered = absl::StrCat("\"", CodePointSlice(source, t.char_start(), t.char_end()), "\"");
        }
      }
      rows.push_back({absl::StrCat(k), t.text(), absl::StrCat(t.id()), absl::StrCat(t.type_id()),
                      span, covered});
    }
    std::vector<int> widths(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
      widths[c] = DisplayWidth(header[c]);
      for (const auto& row : rows) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
    }
    auto print_row = [&](const std::vector<std::string>& row) {
      std::string line = "   ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += c + 1 < row.size() ? PadRight(row[c], widths[c] + 2) : row[c];
      }
      std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(line)).c_str());
    };
    print_row(header);
    for (const auto& row : rows) print_row(row);
  }
  PrintMetadata(response->model_version(), response->metadata());
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// info

int RunInfo(EncoderClient& client) {
  v1::GetModelInfoRequest request;
  request.set_model_version(absl::GetFlag(FLAGS_model_version));
  auto info = client.GetModelInfo(request);
  if (!info.ok()) return RpcError(info.status(), client.target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*info) ? kExitOk : kExitFailure;

  // Walk the message by reflection so new ModelInfo fields show up without touching this.
  const google::protobuf::Descriptor* d = info->GetDescriptor();
  const google::protobuf::Reflection* r = info->GetReflection();
  using FD = google::protobuf::FieldDescriptor;
  std::vector<std::pair<std::string, std::string>> lines;
  size_t key_width = 0;
  for (int f = 0; f < d->field_count(); ++f) {
    const FD* field = d->field(f);
    std::vector<std::string> values;
    const int n = field->is_repeated() ? r->FieldSize(*info, field) : 1;
    for (int k = 0; k < n; ++k) {
      const bool rep = field->is_repeated();
      switch (field->cpp_type()) {
        case FD::CPPTYPE_STRING:
          values.push_back(rep ? r->GetRepeatedString(*info, field, k)
                               : r->GetString(*info, field));
          break;
        case FD::CPPTYPE_INT32:
          values.push_back(
              absl::StrCat(rep ? r->GetRepeatedInt32(*info, field, k) : r->GetInt32(*info, field)));
          break;
        case FD::CPPTYPE_INT64:
          values.push_back(
              absl::StrCat(rep ? r->GetRepeatedInt64(*info, field, k) : r->GetInt64(*info, field)));
          break;
        case FD::CPPTYPE_BOOL:
          values.push_back((rep ? r->GetRepeatedBool(*info, field, k) : r->GetBool(*info, field))
                               ? "true"
                               : "false");
          break;
        case FD::CPPTYPE_ENUM:
          values.push_back(rep ? r->GetRepeatedEnum(*info, field, k)->name()
                               : r->GetEnum(*info, field)->name());
          break;
        default:
          values.push_back("(not shown; use --json)");
      }
    }
    lines.emplace_back(field->name(), absl::StrJoin(values, ", "));
    key_width = std::max(key_width, field->name().size());
  }
  for (const auto& [key, value] : lines) {
    std::printf("%s %s\n", PadRight(key + ":", static_cast<int>(key_width) + 1).c_str(),
                value.c_str());
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// health

int RunHealth(EncoderClient& client) {
  auto status = client.Health(absl::GetFlag(FLAGS_service));
  if (!status.ok()) {
    if (status.status().code() == absl::StatusCode::kNotFound) {
      // The protocol's answer for a service name the server does not know.
      std::printf("SERVICE_UNKNOWN\n");
      std::fprintf(stderr, "attnctl: NOT_FOUND: %s\n",
                   std::string(status.status().message()).c_str());
      return kExitFailure;
    }
    return RpcError(status.status(), client.target());
  }
  if (absl::GetFlag(FLAGS_json)) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(*status);
    if (!PrintJson(response)) return kExitFailure;
  } else {
    std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status).c_str());
  }
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitFailure;
}

// ---------------------------------------------------------------------------------------------
// attention

// What `attention` shows: one head, the grid of all heads, the mean over heads, or rollout.
enum class View { kHead, kAllHeads, kMean, kRollout };

std::string PathForInput(const std::string& path, int index, int count) {
  if (count == 1) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return absl::StrCat(path, "-", index);
  }
  return absl::StrCat(path.substr(0, dot), "-", index, path.substr(dot));
}

bool WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) {
    std::fprintf(stderr, "attnctl: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(stderr, "wrote %s (%zu bytes)\n", path.c_str(), content.size());
  return true;
}

// A [T, T] map, or [heads, T, T] maps with their head numbers.
struct Maps {
  std::vector<int> heads;  // empty for a single aggregate map
  std::vector<float> values;
  std::string description;
};

absl::StatusOr<Maps> ExtractMaps(const v1::AttentionResult& result, View view, int head) {
  const int64_t t = result.tokens_size();
  auto check = [t](const DecodedTensor& d, int rank, const char* what) -> absl::Status {
    const bool ok = d.rank() == rank && d.dim(rank - 1) == t && d.dim(rank - 2) == t;
    if (ok) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat("server sent %s of shape [%s] for %d tokens", what,
                                               absl::StrJoin(d.shape, ", "), t));
  };
  Maps maps;
  if (view == View::kRollout) {
    if (!result.has_rollout()) return absl::InternalError("server sent no rollout");
    auto d = DecodeTensor(result.rollout());
    if (!d.ok()) return d.status();
    if (auto s = check(*d, 2, "rollout"); !s.ok()) return s;
    maps.values = std::move(d->values);
    maps.description = "attention rollout through all layers";
    return maps;
  }
  if (result.layers_size() == 0) return absl::InternalError("server sent no layer");
  const v1::LayerAttention& layer = result.layers(0);
  if (view == View::kMean) {
    if (!layer.has_mean_weights()) return absl::InternalError("server sent no mean weights");
    auto d = DecodeTensor(layer.mean_weights());
    if (!d.ok()) return d.status();
    if (auto s = check(*d, 2, "mean weights"); !s.ok()) return s;
    maps.values = std::move(d->values);
    maps.description = absl::StrFormat("layer %d, mean over heads", layer.layer());
    return maps;
  }
  if (!layer.has_weights()) return absl::InternalError("server sent no attention weights");
  auto d = DecodeTensor(layer.weights());
  if (!d.ok()) return d.status();
  if (auto s = check(*d, 3, "weights"); !s.ok()) return s;
  if (d->dim(0) != layer.heads_size()) {
    return absl::InternalError(
        absl::StrFormat("server sent %d weight maps for %d heads", d->dim(0), layer.heads_size()));
  }
  if (view == View::kAllHeads) {
    maps.heads.assign(layer.heads().begin(), layer.heads().end());
    maps.values = std::move(d->values);
    maps.description = absl::StrFormat("layer %d, all %d heads", layer.layer(), layer.heads_size());
    return maps;
  }
  const auto it = std::find(layer.heads().begin(), layer.heads().end(), head);
  if (it == layer.heads().end()) {
    return absl::InternalError(absl::StrFormat("server sent no map for head %d", head));
  }
  const int64_t index = it - layer.heads().begin();
  maps.values.assign(d->values.begin() + index * t * t, d->values.begin() + (index + 1) * t * t);
  maps.description = absl::StrFormat("layer %d, head %d", layer.layer(), head);
  return maps;
}

// Per row: the `top` most attended columns of a [T, T] map.
void PrintTopAttended(const std::vector<std::string>& tokens, const float* map, int top) {
  const int t = static_cast<int>(tokens.size());
  int width = 0;
  for (const auto& token : tokens) width = std::max(width, DisplayWidth(token));
  const int k = std::min(top, t);
  std::vector<int> order(t);
  for (int i = 0; i < t; ++i) {
    const float* row = map + static_cast<size_t>(i) * t;
    for (int j = 0; j < t; ++j) order[j] = j;
    // Ties keep the earlier token first, so output is stable.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int a, int b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::string line = absl::StrFormat("  %3d %s ->", i, PadRight(tokens[i], width));
    for (int n = 0; n < k; ++n) {
      absl::StrAppendFormat(&line, "  %s(%d) %.3f", tokens[order[n]], order[n], row[order[n]]);
    }
    std::printf("%s\n", line.c_str());
  }
}

int RunAttention(EncoderClient& client, const Command& command) {
  const int head = absl::GetFlag(FLAGS_head);
  const bool rollout = absl::GetFlag(FLAGS_rollout);
  const bool mean = absl::GetFlag(FLAGS_mean);
  const std::string svg_path = absl::GetFlag(FLAGS_svg);
  const std::string html_path = absl::GetFlag(FLAGS_html);
  const bool json = absl::GetFlag(FLAGS_json);
  const bool pictures = !svg_path.empty() || !html_path.empty();
  const int top = absl::GetFlag(FLAGS_top);
  if (head < -1) return UsageError("--head must be a head number >= 0", &command);
  if (rollout && mean) return UsageError("--rollout and --mean exclude each other", &command);
  if ((rollout || mean) && head >= 0) {
    return UsageError("--head picks one head; --rollout and --mean combine all heads", &command);
  }
  if (top < 1) return UsageError("--top must be >= 1", &command);

  // Text output without a head shows the mean over heads (12 full tables would be unreadable).
  View view = View::kAllHeads;
  if (rollout) {
    view = View::kRollout;
  } else if (mean || (head < 0 && !pictures && !json)) {
    view = View::kMean;
  } else if (head >= 0) {
    view = View::kHead;
  }

  v1::AttentionMapRequest request;
  auto texts = FillSharedRequestFields(&request);
  if (!texts.ok()) return UsageError(std::string(texts.status().message()), &command);
  request.add_layers(absl::GetFlag(FLAGS_layer));
  if (head >= 0) request.add_heads(head);
  // Only ask for what is shown: per-head weights are [heads, T, T] per input.
  request.set_include_weights(view == View::kHead || view == View::kAllHeads);
  request.set_mean_over_heads(view == View::kMean);
  request.set_rollout(view == View::kRollout);

  auto response = client.AttentionMap(request);
  if (!response.ok()) return RpcError(response.status(), client.target());
  if (json && !PrintJson(*response)) return kExitFailure;
  if (json && !pictures) return kExitOk;

  std::vector<HtmlSection> sections;
  const int count = response->results_size();
  for (int i = 0; i < count; ++i) {
    const v1::AttentionResult& result = response->results(i);
    std::vector<std::string> tokens;
    for (const v1::Token& t : result.tokens()) tokens.push_back(t.text());
    auto maps = ExtractMaps(result, view, head);
    if (!maps.ok()) {
      std::fprintf(stderr, "attnctl: input %d: %s\n", i,
                   std::string(maps.status().message()).c_str());
      return kExitFailure;
    }
    const std::string what = i < static_cast<int>(texts->size()) ? (*texts)[i].Describe() : "";
    if (!pictures) {
      std::printf("[%d] %s (%zu tokens%s): %s, top %d attended tokens per row\n", i, what.c_str(),
                  tokens.size(),
                  TruncationNote(result.truncated(), result.untruncated_length()).c_str(),
                  maps->description.c_str(), top);
      PrintTopAttended(tokens, maps->values.data(), top);
      continue;
    }
    absl::StatusOr<std::string> svg;
    if (view == View::kAllHeads) {
      const int layer = result.layers_size() > 0 ? result.layers(0).layer() : 0;
      svg = RenderHeadGridSvg(tokens, maps->heads, maps->values, layer);
    } else {
      HeatmapOptions options;
      if (view == View::kRollout) options.value_label = "rollout weight";
      svg = RenderHeatmapSvg(tokens, maps->values, maps->description, options);
    }
    if (!svg.ok()) {
      std::fprintf(stderr, "attnctl: input %d: %s\n", i,
                   std::string(svg.status().message()).c_str());
      return kExitFailure;
    }
    if (!svg_path.empty() && !WriteFile(PathForInput(svg_path, i, count), *svg)) {
      return kExitFailure;
    }
    sections.push_back(
        {absl::StrFormat("Input %d: %s", i, what),
         absl::StrFormat("%s; %d tokens%s.", maps->description, tokens.size(),
                         TruncationNote(result.truncated(), result.untruncated_length())),
         *std::move(svg)});
  }
  if (!pictures) PrintMetadata(response->model_version(), response->metadata());
  if (!html_path.empty()) {
    const std::string subtitle =
        absl::StrFormat("model version %s, server %s", response->model_version(), client.target());
    if (!WriteFile(html_path, RenderHtml("attnserve attention maps", subtitle, sections))) {
      return kExitFailure;
    }
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// Trainer commands: shared

// The bearer token: --token-file (whitespace around it stripped), else $ATTNSERVE_TOKEN, else
// none (the server then answers UNAUTHENTICATED, and TrainerRpcError says how to pass one).
absl::StatusOr<std::string> LoadToken() {
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrFormat("cannot read token file %s: %s", path, std::strerror(errno)));
    }
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string token(absl::StripAsciiWhitespace(buffer.str()));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("token file %s is empty", path));
    }
    return token;
  }
  const char* env = std::getenv("ATTNSERVE_TOKEN");
  return std::string(absl::StripAsciiWhitespace(env != nullptr ? env : ""));
}

// RpcError plus what to do about the errors specific to the Trainer.
int TrainerRpcError(const absl::Status& status, const std::string& target) {
  RpcError(status, target);
  const char* env = std::getenv("ATTNSERVE_TOKEN");
  const bool have_token = !absl::GetFlag(FLAGS_token_file).empty() ||
                          (env != nullptr && !absl::StripAsciiWhitespace(env).empty());
  const char* hint = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      hint = have_token ? "the server did not accept the token's format"
                        : "the Trainer needs its token: pass --token-file PATH or set "
                          "ATTNSERVE_TOKEN";
      break;
    case absl::StatusCode::kPermissionDenied:
      hint =
          "wrong token: compare --token-file / $ATTNSERVE_TOKEN with the server's "
          "--trainer-token-file";
      break;
    case absl::StatusCode::kUnimplemented:
      hint = "this server has no Trainer service (start it with --trainer-token-file)";
      break;
    default:
      break;
  }
  if (hint != nullptr) std::fprintf(stderr, "attnctl: hint: %s\n", hint);
  return kExitFailure;
}

// A TrainerClient for the command line's server, options and token; nullptr after printing
// the error (exit code in *exit_code).
std::unique_ptr<TrainerClient> MakeTrainerClient(int* exit_code) {
  auto token = LoadToken();
  if (!token.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(token.status().message()).c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  ClientOptions options = OptionsFromFlags();
  options.bearer_token = *token;
  return std::make_unique<TrainerClient>(ServerAddress(), options);
}

// ---------------------------------------------------------------------------------------------
// versions, rollback, serve-version

void PrintVersionsTable(const v1::ListVersionsResponse& response) {
  if (response.versions_size() == 0) {
    std::printf("no versions\n");
    return;
  }
  bool descriptions = false;
  for (const v1::VersionInfo& v : response.versions()) descriptions |= !v.description().empty();
  std::vector<std::string> header = {"", "version", "created", "origin"};
  if (descriptions) header.push_back("description");
  std::vector<std::vector<std::string>> rows;
  for (const v1::VersionInfo& v : response.versions()) {
    const bool serving = v.serving() || v.version() == response.serving_version();
    std::vector<std::string> row = {serving ? "*" : "", v.version(), v.created_utc(), v.origin()};
    if (descriptions) row.push_back(ShortText(v.description(), 60));
    rows.push_back(std::move(row));
  }
  std::vector<int> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    widths[c] = DisplayWidth(header[c]);
    for (const auto& row : rows) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += c + 1 < row.size() ? PadRight(row[c], widths[c] + (c == 0 ? 1 : 2)) : row[c];
    }
    std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(line)).c_str());
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

int RunVersions() {
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = client->ListVersions();
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  PrintVersionsTable(*response);
  return kExitOk;
}

int RunServingChange(const Command& command) {
  const bool rollback = command.name == std::string("rollback");
  const std::string version = absl::GetFlag(FLAGS_model_version);
  if (!rollback && version.empty()) {
    return UsageError("serve-version needs --version V (see 'attnctl versions')", &command);
  }
  int exit_code = kExitOk;
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  auto response = rollback ? client->Rollback(version) : client->SetServingVersion(version);
  if (!response.ok()) return TrainerRpcError(response.status(), client->target());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response) ? kExitOk : kExitFailure;
  std::printf("%s %s\n\n", rollback ? "rolled back: now serving" : "now serving",
              response->serving_version().c_str());
  PrintVersionsTable(*response);
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// finetune

// Set by SIGINT/SIGTERM while a job runs: the number of signals and the last one.
std::atomic<int> g_interrupts{0};
std::atomic<int> g_interrupt_signal{0};

void OnInterrupt(int signal) {
  g_interrupt_signal.store(signal);
  g_interrupts.fetch_add(1);
}

void InstallInterruptHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// Batches sent ahead of the server's answers: the next batch is always waiting when a step
// ends, and Ctrl-C stops the job within a step or two.
constexpr int64_t kBatchesInFlight = 2;

// "0:07", "12:34", "1:02:03".
std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

int TerminalColumns() {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

struct FineTunePlan {
  std::string data_path;
  TrainingData data;
  int epochs = 1;
  int batch_size = 16;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  uint64_t seed = 0;
  bool commit = false;
  std::string description;
  v1::FineTuneConfig config;
};

const char* ObjectiveName(v1::Objective objective) {
  switch (objective) {
    case v1::CONTRASTIVE:
      return "contrastive";
    case v1::COSINE_SIMILARITY:
      return "cosine";
    case v1::CLASSIFICATION:
      return "classification";
    default:
      return "?";
  }
}

std::string DescribePlan(const FineTunePlan& plan) {
  const size_t n = plan.data.examples.size();
  std::string what = absl::StrFormat("%d %s examples", n, ObjectiveName(plan.data.objective));
  if (plan.data.objective == v1::CONTRASTIVE && plan.data.has_negatives) {
    absl::StrAppend(&what, " with hard negatives");
  }
  if (plan.data.objective == v1::CLASSIFICATION) {
    absl::StrAppendFormat(&what, ", %d labels", plan.config.num_labels());
  }
  auto plural = [](int64_t k, const char* word) {
    return absl::StrFormat("%d %s%s", k, word, k == 1 ? "" : "s");
  };
  std::string steps =
      absl::StrFormat("%s x %s = %s, ", plural(plan.epochs, "epoch"),
                      plural(plan.steps_per_epoch, "step"), plural(plan.total_steps, "step"));
  if (static_cast<int64_t>(n) <= plan.batch_size) {
    absl::StrAppendFormat(&steps, "one batch of %d", n);
  } else if (n % plan.batch_size == 0) {
    absl::StrAppendFormat(&steps, "batches of %d", plan.batch_size);
  } else {
    absl::StrAppendFormat(&steps, "batches of %d (the last of each epoch: %d)", plan.batch_size,
                          n % plan.batch_size);
  }
  std::string lr = absl::StrFormat("lr %g", plan.config.learning_rate());
  if (plan.config.warmup_steps() > 0) {
    absl::StrAppendFormat(&lr, ", warm-up %d steps", plan.config.warmup_steps());
  }
  absl::StrAppend(&lr, ", linear decay to 0");
  return absl::StrFormat("%s: %s\nplan: %s; %s; seed %d", plan.data_path, what, steps, lr,
                         plan.seed);
}

// Checks the flags and the data file: the whole job, before any connection. Returns the exit
// code on error.
absl::StatusOr<FineTunePlan> PlanFineTune(const Command& command, int* exit_code) {
  auto usage = [&](const std::string& message) {
    *exit_code = UsageError(message, &command);
    return absl::InvalidArgumentError(message);
  };
  FineTunePlan plan;
  plan.data_path = absl::GetFlag(FLAGS_data);
  if (plan.data_path.empty()) return usage("finetune needs --data FILE (JSON Lines)");
  const std::string objective_flag = absl::AsciiStrToLower(absl::GetFlag(FLAGS_objective));
  v1::Objective objective;
  if (objective_flag == "contrastive") {
    objective = v1::CONTRASTIVE;
  } else if (objective_flag == "cosine" || objective_flag == "cosine-similarity" ||
             objective_flag == "cosine_similarity") {
    objective = v1::COSINE_SIMILARITY;
  } else if (objective_flag == "classification") {
    objective = v1::CLASSIFICATION;
  } else if (objective_flag.empty()) {
    return usage("finetune needs --objective contrastive|cosine|classification");
  } else {
    return usage(absl::StrCat("--objective must be contrastive, cosine or classification, not '",
                              objective_flag, "'"));
  }
  plan.epochs = absl::GetFlag(FLAGS_epochs);
  if (plan.epochs < 1) return usage("--epochs must be >= 1");
  plan.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (plan.batch_size < 1) return usage("--batch-size must be >= 1");
  const double lr = absl::GetFlag(FLAGS_lr);
  if (!(lr > 0) || !std::isfinite(lr)) return usage("--lr must be a positive number");
  const int64_t warmup = absl::GetFlag(FLAGS_warmup_steps);
  if (warmup < 0) return usage("--warmup-steps must be >= 0");
  const int num_labels = absl::GetFlag(FLAGS_num_labels);
  if (num_labels != 0 && objective != v1::CLASSIFICATION) {
    return usage("--num-labels applies to --objective classification only");
  }
  if (num_labels < 0 || num_labels == 1) return usage("--num-labels must be >= 2");
  const std::string parameters = absl::AsciiStrToLower(absl::GetFlag(FLAGS_parameters));
  v1::ParameterSelection selection;
  if (parameters == "all") {
    selection = v1::PARAMETERS_ALL;
  } else if (parameters == "attention") {
    selection = v1::PARAMETERS_ATTENTION_ONLY;
  } else if (parameters == "all-but-embeddings" || parameters == "all_but_embeddings") {
    selection = v1::PARAMETERS_ALL_BUT_EMBEDDINGS;
  } else if (parameters == "head") {
    selection = v1::PARAMETERS_HEAD_ONLY;
  } else {
    return usage(absl::StrCat(
        "--parameters must be all, attention, all-but-embeddings or head, not '", parameters, "'"));
  }
  if (selection == v1::PARAMETERS_HEAD_ONLY && objective != v1::CLASSIFICATION) {
    return usage("--parameters head needs --objective classification (only it has a head)");
  }
  plan.commit = absl::GetFlag(FLAGS_commit);
  plan.description = absl::GetFlag(FLAGS_description);
  if (!plan.description.empty() && !plan.commit) {
    return usage("--description is stored with a committed version: add --commit");
  }
  if (absl::GetFlag(FLAGS_log_every) < 0) return usage("--log-every must be >= 0");
  auto tokenization = TokenizationFromFlags();
  if (!tokenization.ok()) return usage(std::string(tokenization.status().message()));

  DataLimits limits;
  limits.num_labels = num_labels;
  auto data = ReadTrainingData(plan.data_path, objective, limits);
  if (!data.ok()) {
    if (data.status().code() == absl::StatusCode::kInvalidArgument) {
      // One problem per line, each "file:line: what".
      for (absl::string_view line : absl::StrSplit(data.status().message(), '\n')) {
        std::fprintf(stderr, "attnctl: %s\n", std::string(line).c_str());
      }
      std::fprintf(stderr, "Run 'attnctl finetune --help' for the data format.\n");
      *exit_code = kExitUsage;
    } else {
      std::fprintf(stderr, "attnctl: %s\n", std::string(data.status().message()).c_str());
      *exit_code = kExitFailure;
    }
    return data.status();
  }
  plan.data = *std::move(data);
  plan.steps_per_epoch = StepsPerEpoch(plan.data.examples.size(), plan.batch_size);
  plan.total_steps = plan.steps_per_epoch * plan.epochs;
  if (warmup > plan.total_steps) {
    return usage(
        absl::StrFormat("--warmup-steps %d exceeds the job's %d steps", warmup, plan.total_steps));
  }
  plan.seed = absl::GetFlag(FLAGS_seed);

  v1::FineTuneConfig& config = plan.config;
  config.set_objective(objective);
  config.set_learning_rate(lr);
  config.set_warmup_steps(warmup);
  config.set_total_steps(plan.total_steps);
  config.set_parameters(selection);
  config.set_seed(plan.seed);
  config.set_disable_dropout(absl::GetFlag(FLAGS_no_dropout));
  config.set_base_version(absl::GetFlag(FLAGS_base_version));
  *config.mutable_tokenization() = *tokenization;
  if (objective == v1::CLASSIFICATION) {
    config.set_num_labels(num_labels > 0 ? num_labels : std::max(2, plan.data.max_label + 1));
  }
  return plan;
}

// What the reader thread learns from the stream; guarded by `mu` (which also serialises
// everything written to the terminal while the job runs).
struct JobState {
  std::mutex mu;
  std::condition_variable cv;
  bool stream_ended = false;
  int64_t step = 0;  // completed steps reported by the server
  std::chrono::steady_clock::time_point last_message;
  std::string job_id, base_version, committed_version;
  double first_loss = std::numeric_limits<double>::quiet_NaN();
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  bool bar_visible = false;  // a progress bar is on the terminal's current line
};

class ProgressPrinter {
 public:
  enum class Mode { kBar, kLines, kJson };

  ProgressPrinter(const FineTunePlan& plan, Mode mode, int log_every)
      : plan_(plan), mode_(mode), start_(std::chrono::steady_clock::now()) {
    log_every_ = log_every > 0 ? log_every : std::max<int64_t>(1, (plan.total_steps + 19) / 20);
  }

  Mode mode() const { return mode_; }
  double Elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // Called with state->mu held, for every message.
  void Show(const v1::FineTuneProgress& p, bool new_step, JobState* state) {
    if (mode_ == Mode::kJson) {
      PrintJson(p);
      std::fflush(stdout);
      return;
    }
    if (!new_step) return;
    const int64_t step = p.step();
    const auto now = std::chrono::steady_clock::now();
    if (first_step_ < 0) {
      first_step_ = step;
      first_time_ = now;
    }
    if (mode_ == Mode::kLines) {
      if (step == 1 || step % log_every_ == 0 || step >= plan_.total_steps) {
        std::fprintf(stderr, "%s\n", Status(p, now).c_str());
      }
      return;
    }
    // A bar: redraw at most 10 times a second, and always for the last step.
    if (step < plan_.total_steps && last_draw_ != std::chrono::steady_clock::time_point() &&
        now - last_draw_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_draw_ = now;
    const std::string status = Status(p, now);
    const int columns = TerminalColumns();
    std::string line =
        absl::StrFormat("step %*d/%d", Digits(plan_.total_steps), step, plan_.total_steps);
    const int bar_width =
        std::min(30, columns - 1 - DisplayWidth(line) - 3 - DisplayWidth(status) - 2);
    const double fraction =
        plan_.total_steps > 0 ? std::min(1.0, static_cast<double>(step) / plan_.total_steps) : 1;
    if (bar_width >= 10) {
      const int filled = static_cast<int>(fraction * bar_width);
      std::string bar(filled, '=');
      if (filled < bar_width) bar += '>' + std::string(bar_width - filled - 1, ' ');
      absl::StrAppend(&line, " [", bar, "]");
    }
    absl::StrAppendFormat(&line, " %3d%%  %s", static_cast<int>(fraction * 100), status);
    if (DisplayWidth(line) > columns - 1) line = CodePointPrefix(line, columns - 1);
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    std::fflush(stderr);
    state->bar_visible = true;
  }

  // Ends the bar's line (before other output, and at the end).
  void BreakLine(JobState* state) {
    if (state->bar_visible) {
      std::fputc('\n', stderr);
      state->bar_visible = false;
    }
  }

 private:
  static int Digits(int64_t n) { return static_cast<int>(absl::StrCat(n).size()); }
  static std::string CodePointPrefix(const std::string& s, int n) {
    std::string out;
    int cp = -1;
    for (char c : s) {
      if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++cp;
      if (cp >= n) break;
      out.push_back(c);
    }
    return out;
  }

  // "epoch 1/2  loss 0.4123  lr 1.60e-05  312.4 ex/s  ETA 0:42" (lines: with the step first).
  std::string Status(const v1::FineTuneProgress& p,
                     std::chrono::steady_clock::time_point now) const {
    const int64_t step = p.step();
    const int64_t epoch =
        plan_.steps_per_epoch > 0
            ? std::min<int64_t>(plan_.epochs,
                                (std::max<int64_t>(step, 1) - 1) / plan_.steps_per_epoch + 1)
            : 1;
    // ETA from the pace since the first answered step (the first includes the job's set-up).
    double eta = std::numeric_limits<double>::quiet_NaN();
    const double since_first = std::chrono::duration<double>(now - first_time_).count();
    if (step > first_step_ && since_first > 0) {
      eta = (plan_.total_steps - step) * since_first / (step - first_step_);
    } else if (step > 0) {
      eta = (plan_.total_steps - step) * Elapsed() / step;
    }
    std::string s;
    if (mode_ == Mode::kLines) {
      s = absl::StrFormat("step %d/%d  ", step, plan_.total_steps);
    }
    absl::StrAppendFormat(&s, "epoch %d/%d  loss %.4f  lr %.2e  %.1f ex/s  ", epoch, plan_.epochs,
                          p.loss(), p.learning_rate(), p.examples_per_second());
    if (mode_ == Mode::kLines) absl::StrAppend(&s, "elapsed ", FormatDuration(Elapsed()), "  ");
    absl::StrAppend(&s, "ETA ", step >= plan_.total_steps ? "0:00" : FormatDuration(eta));
    return s;
  }

  const FineTunePlan& plan_;
  const Mode mode_;
  const std::chrono::steady_clock::time_point start_;
  int64_t log_every_ = 1;
  int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point first_time_;
  std::chrono::steady_clock::time_point last_draw_;
};

int RunFineTune(const Command& command) {
  int exit_code = kExitOk;
  auto planned = PlanFineTune(command, &exit_code);
  if (!planned.ok()) return exit_code;
  const FineTunePlan& plan = *planned;
  const bool json = absl::GetFlag(FLAGS_json);
  if (absl::GetFlag(FLAGS_dry_run)) {
    std::printf("%s\n", DescribePlan(plan).c_str());
    std::printf("dry run: data OK, nothing sent\n");
    return kExitOk;
  }
  auto client = MakeTrainerClient(&exit_code);
  if (client == nullptr) return exit_code;
  std::fprintf(stderr, "%s\n", DescribePlan(plan).c_str());

  const ProgressPrinter::Mode mode = json                    ? ProgressPrinter::Mode::kJson
                                     : isatty(STDERR_FILENO) ? ProgressPrinter::Mode::kBar
                                                             : ProgressPrinter::Mode::kLines;
  ProgressPrinter printer(plan, mode, absl::GetFlag(FLAGS_log_every));
  InstallInterruptHandlers();
  std::unique_ptr<FineTuneSession> session = client->FineTune();
  if (absl::Status s = session->Start(plan.config); !s.ok()) {
    return TrainerRpcError(s, client->target());
  }

  JobState state;
  state.last_message = std::chrono::steady_clock::now();
  std::thread reader([&] {
    v1::FineTuneProgress progress;
    while (session->Read(&progress)) {
      std::lock_guard<std::mutex> lock(state.mu);
      state.last_message = std::chrono::steady_clock::now();
      if (!progress.job_id().empty()) state.job_id = progress.job_id();
      if (!progress.base_version().empty()) state.base_version = progress.base_version();
      if (!progress.committed_version().empty()) {
        state.committed_version = progress.committed_version();
      }
      const bool new_step = progress.step() > state.step;
      if (new_step) {
        if (std::isnan(state.first_loss)) state.first_loss = progress.loss();
        state.last_loss = progress.loss();
        state.step = progress.step();
      }
      printer.Show(progress, new_step, &state);
      state.cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(state.mu);
    state.stream_ended = true;
    state.cv.notify_all();
  });

  const int timeout_ms = std::max(0, absl::GetFlag(FLAGS_timeout_ms));
  bool timed_out = false;
  int interrupts_seen = 0;
  // Between server messages, at most timeout_ms while the server owes an answer.
  auto idle_too_long = [&](const JobState& s) {
    return timeout_ms > 0 && std::chrono::steady_clock::now() - s.last_message >
                                 std::chrono::milliseconds(timeout_ms);
  };
  auto note = [&](const std::string& message) {  // with state.mu held
    printer.BreakLine(&state);
    std::fprintf(stderr, "attnctl: %s\n", message.c_str());
  };

  // Send the batches, at most kBatchesInFlight ahead of the server.
  int64_t sent = 0;
  bool broken = false, interrupted = false;
  for (int epoch = 0; epoch < plan.epochs && !broken && !interrupted && !timed_out; ++epoch) {
    const std::vector<size_t> order = EpochOrder(plan.data.examples.size(), plan.seed, epoch);
    for (size_t begin = 0; begin < order.size(); begin += plan.batch_size) {
      {
        std::unique_lock<std::mutex> lock(state.mu);
        while (true) {
          if (g_interrupts.load() > 0) {
            interrupted = true;
            break;
          }
          if (state.stream_ended) {
            broken = true;
            break;
          }
          if (sent - state.step < kBatchesInFlight) break;
          if (idle_too_long(state)) {
            timed_out = true;
            break;
          }
          state.cv.wait_for(lock, std::chrono::milliseconds(50));
        }
      }
      if (broken || interrupted || timed_out) break;
      const size_t end = std::min(order.size(), begin + plan.batch_size);
      v1::TrainingBatch batch;
      for (size_t i = begin; i < end; ++i) *batch.add_examples() = plan.data.examples[order[i]];
      if (!session->SendBatch(batch)) {
        broken = true;
        break;
      }
      ++sent;
    }
  }

  bool aborted_by_us = false;
  if (timed_out) {
    session->Cancel();
  } else if (interrupted) {
    interrupts_seen = g_interrupts.load();
    {
      std::lock_guard<std::mutex> lock(state.mu);
      note(
          "interrupted: aborting the job after the current step (Ctrl-C again to disconnect "
          "at once)");
    }
    session->Abort();
    aborted_by_us = true;
  } else if (!broken) {
    if (plan.commit) {
      session->Commit(plan.description);
    } else {
      session->Abort();
      aborted_by_us = true;
    }
  }

  // Wait for the server's last messages; a second Ctrl-C or a silent server cancels the call.
  {
    std::unique_lock<std::mutex> lock(state.mu);
    while (!state.stream_ended) {
      const int interrupts = g_interrupts.load();
      if (interrupts > interrupts_seen) {
        if (interrupts_seen == 0 && !interrupted && plan.commit && !broken) {
          note("the commit was already requested; waiting for it (Ctrl-C again to disconnect)");
        } else {
          note("disconnecting");
          session->Cancel();
        }
        interrupted = true;
        interrupts_seen = interrupts;
      }
      if (!timed_out && idle_too_long(state)) {
        timed_out = true;
        session->Cancel();
      }
      state.cv.wait_for(lock, std::chrono::milliseconds(50));
    }
    printer.BreakLine(&state);
  }
  reader.join();
  const absl::Status status = session->Finish();
  const double seconds = printer.Elapsed();

  // Summary: stdout, or stderr when stdout carries the JSON lines.
  FILE* out = json ? stderr : stdout;
  std::string summary =
      absl::StrFormat("%d/%d steps in %s", state.step, plan.total_steps, FormatDuration(seconds));
  if (!std::isnan(state.first_loss)) {
    absl::StrAppendFormat(&summary, ", loss %.4f \u2192 %.4f", state.first_loss, state.last_loss);
  }
  if (!state.job_id.empty()) summary = absl::StrCat("job ", state.job_id, ": ", summary);
  if (!state.base_version.empty()) absl::StrAppend(&summary, " (from ", state.base_version, ")");

  if (timed_out) {
    std::fprintf(out, "%s\n", summary.c_str());
    std::fprintf(stderr,
                 "attnctl: no answer from the server for %d ms: cancelled the job (nothing "
                 "committed; raise --timeout-ms for slow steps, 0 = no limit)\n",
                 timeout_ms);
    return kExitFailure;
  }
  const bool ended_ok =
      status.ok() || (aborted_by_us && (status.code() == absl::StatusCode::kAborted ||
                                        status.code() == absl::StatusCode::kCancelled));
  if (interrupted && state.committed_version.empty()) {
    std::fprintf(out, "%s\n", summary.c_str());
    std::fprintf(out, "aborted: nothing committed, serving unchanged\n");
    const int signal = g_interrupt_signal.load();
    return 128 + (signal > 0 ? signal : SIGINT);
  }
  if (!ended_ok) {
    // A job refused at the start (auth, a running job, a bad config) gets the error alone.
    if (state.job_id.empty()) return TrainerRpcError(status, client->target());
    std::fprintf(out, "%s\n", summary.c_str());
    TrainerRpcError(status, client->target());
    absl::FPrintF(stderr, "attnctl: the job stopped after step %d of %d; nothing committed\n",
                  state.step, plan.total_steps);
    return kExitFailure;
  }
  std::fprintf(out, "%s\n", summary.c_str());
  if (plan.commit) {
    if (state.committed_version.empty()) {
      std::fprintf(stderr, "attnctl: the server ended the job without a committed version\n");
      return kExitFailure;
    }
    std::fprintf(out, "committed version %s (now served by default; 'attnctl rollback' undoes)\n",
                 state.committed_version.c_str());
  } else {
    std::fprintf(out, "not committed (pass --commit to publish)\n");
  }
  return kExitOk;
}

int Main(int argc, char** argv) {
  // Help first, before any validation: "attnctl", "attnctl --help", "attnctl help [cmd]",
  // "attnctl <cmd> --help".
  const Command* help_command = nullptr;
  bool help = argc < 2;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || (i == 1 && arg == "help")) help = true;
    if (help_command == nullptr && !arg.empty() && arg[0] != '-') help_command = FindCommand(arg);
  }
  // rollback/serve-version: "--version V" is the model version, not Abseil's --version.
  std::vector<std::string> rewritten;
  std::vector<char*> rewritten_argv;
  if (!help && help_command != nullptr && TakesVersionFlag(*help_command)) {
    for (int i = 0; i < argc; ++i) {
      std::string arg = argv[i];
      if (i > 0 && (arg == "--version" || arg == "-version")) {
        if (i + 1 >= argc)
          return UsageError("--version needs a value (a model version)", help_command);
        arg = "--model_version";
      } else if (i > 0 &&
                 (absl::StartsWith(arg, "--version=") || absl::StartsWith(arg, "-version="))) {
        arg = absl::StrCat("--model_version", arg.substr(arg.find('=')));
      }
      if (arg == "--") {
        for (; i < argc; ++i) rewritten.push_back(argv[i]);
        break;
      }
      rewritten.push_back(arg);
    }
    for (std::string& arg : rewritten) rewritten_argv.push_back(arg.data());
    rewritten_argv.push_back(nullptr);
    argv = rewritten_argv.data();
  }
  if (argc < 2) {
    std::fputs(kTopUsage, stderr);
    return kExitUsage;
  }
  if (help) {
    if (help_command != nullptr) {
      PrintCommandUsage(*help_command, stdout);
    } else {
      std::fputs(kTopUsage, stdout);
    }
    return kExitOk;
  }

  std::vector<std::string> original(argv, argv + argc);
  attn::AcceptDashedFlagNames(argc, argv);
  // Abseil's informational flags (--version, --helpfull, --helpon=...) need no command:
  // ParseCommandLine prints and exits.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    absl::ConsumePrefix(&arg, "-");
    absl::ConsumePrefix(&arg, "-");
    arg = arg.substr(0, arg.find('='));
    if (arg == "version" || arg == "helpfull" || arg == "helpshort" || arg == "helppackage" ||
        arg == "helpon" || arg == "helpmatch") {
      absl::ParseCommandLine(argc, argv);
    }
  }
  int exit_code = kExitOk;
  const Command* command = ValidateCommandLine(argc, argv, original, &exit_code);
  if (command == nullptr) return exit_code;
  absl::ParseCommandLine(argc, argv);

  const std::string name = command->name;
  if (name == "finetune") return RunFineTune(*command);
  if (name == "versions") return RunVersions();
  if (name == "rollback" || name == "serve-version") return RunServingChange(*command);
  EncoderClient client(ServerAddress(), OptionsFromFlags());
  if (name == "encode") return RunEncode(client, *command);
  if (name == "attention") return RunAttention(client, *command);
  if (name == "tokenize") return RunTokenize(client, *command);
  if (name == "info") return RunInfo(client);
  return RunHealth(client);
}

}  // namespace
}  // namespace attn::client

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("command-line client for attnserve; see 'attnctl --help'");
  absl::FlagsUsageConfig config;
  config.version_string = [] { return attn::ProgramVersion("attnctl") + "\n"; };
  absl::SetFlagsUsageConfig(config);
  return attn::client::Main(argc, argv);
}
