#include "server/core/batcher.h"

#include <omp.h>

#include <algorithm>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/log.h"

namespace attn::server {

using Clock = std::chrono::steady_clock;

struct Batcher::JobState {
  std::shared_ptr<Job> job;
  Clock::time_point enqueued;
  JobOutput output;
  int remaining_chunks = 0;
  int64_t tokens = 0;     // of the whole job
  bool finished = false;  // done() called (failure or success)
  bool started = false;
};

Batcher::Batcher(BatcherOptions options, ServingMetrics* metrics)
    : options_(options), metrics_(metrics), worker_([this] { Loop(); }) {}

Batcher::~Batcher() { Stop(); }

absl::Status Batcher::Submit(std::shared_ptr<Job> job) {
  auto state = std::make_shared<JobState>();
  state->job = std::move(job);
  state->enqueued = Clock::now();
  state->output.sequences.resize(state->job->sequences.size());

  // Split into chunks within the token budget, keeping sequence order (a task is one chunk).
  std::vector<Chunk> chunks;
  if (state->job->task) {
    state->tokens = state->job->task_tokens;
    chunks.push_back(Chunk{state, 0, 0, state->tokens});
  }
  Chunk current{state, 0, 0, 0};
  for (int i = 0; i < static_cast<int>(state->job->sequences.size()); ++i) {
    const int64_t tokens = static_cast<int64_t>(state->job->sequences[i].token_ids.size());
    if (current.end > current.begin && current.tokens + tokens > options_.max_batch_tokens) {
      chunks.push_back(current);
      current = Chunk{state, i, i, 0};
    }
    current.end = i + 1;
    current.tokens += tokens;
    state->tokens += tokens;
  }
  if (current.end > current.begin) chunks.push_back(current);
  state->remaining_chunks = static_cast<int>(chunks.size());

  absl::MutexLock lock(&mutex_);
  if (stopping_) return absl::UnavailableError("the server is shutting down; retry elsewhere");
  if (admitted_ >= options_.max_concurrent_requests) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server busy: ", admitted_, " requests already queued or running (limit ",
        options_.max_concurrent_requests, ", --max-concurrent-requests); retry with back-off"));
  }
  ++admitted_;
  metrics_->SetQueueDepth(admitted_);
  for (Chunk& chunk : chunks) queue_.push_back(std::move(chunk));
  return absl::OkStatus();
}

void Batcher::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

void Batcher::Finish(const std::shared_ptr<JobState>& job, absl::Status status) {
  if (job->finished) return;
  job->finished = true;
  {
    // Before done(): a client holding its answer must not see its request still counted in
    // attnserve_queue_depth (ServingTest scrapes right after its calls return).
    absl::MutexLock lock(&mutex_);
    --admitted_;
    metrics_->SetQueueDepth(admitted_);
  }
  job->job->done(std::move(status), std::move(job->output));
}

namespace {

// Why `job` is no longer wanted ("deadline" or "cancelled"), or nullptr.
const char* DropReason(const Job& job) {
  if (job.deadline && *job.deadline < std::chrono::system_clock::now()) return "deadline";
  // After the deadline check: gRPC also reports an expired call as cancelled.
  if (job.is_cancelled && job.is_cancelled()) return "cancelled";
  return nullptr;
}

// Whether two requests may share a packed batch: the engine keeps hidden states for every
// sequence of a batch and attention parts for every sequence that wants attention, so only
// requests keeping the same extras are merged (the common plain-embedding call always is).
bool SameExtras(const ForwardOptions& a, const ForwardOptions& b) {
  if (a.hidden_layers != b.hidden_layers || a.static_embeddings != b.static_embeddings) {
    return false;
  }
  if (a.attention_layers.empty() || b.attention_layers.empty()) return true;
  return a.attention_layers == b.attention_layers && a.attention_scores == b.attention_scores &&
         a.attention_qkv == b.attention_qkv;
}

}  // namespace

bool Batcher::StillWanted(const std::shared_ptr<JobState>& job, const char* stage) {
  if (job->finished) return false;
  const char* reason = DropReason(*job->job);
  if (reason == nullptr) return true;
  metrics_->RecordDropped(reason, stage);
  const double waited =
      std::chrono::duration<double, std::milli>(Clock::now() - job->enqueued).count();
  const bool queued = std::string_view(stage) == "queue";
  const std::string where =
      queued ? absl::StrFormat("while the request was queued (after %.1f ms)", waited)
             : absl::StrFormat(
                   "while the request was computed (after %.1f ms); the rest of "
                   "the work was skipped",
                   waited);
  if (std::string_view(reason) == "deadline") {
    Finish(job, absl::DeadlineExceededError(absl::StrCat(
                    "the deadline passed ", where, "; allow more time or send smaller requests")));
  } else {
    Finish(job, absl::CancelledError(absl::StrCat("the client cancelled the call ", where)));
  }
  return false;
}

void Batcher::Loop() {
  // OpenMP's thread count is per thread (a new thread starts from the default, not from what
  // main() set), so the engine thread sets its own.
  if (options_.threads > 0) omp_set_num_threads(options_.threads);
  while (true) {
    std::vector<Chunk> batch;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(
          +[](Batcher* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mutex_) {
            return !self->queue_.empty() || self->stopping_;
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      batch = TakeBatch(/*forwards_only=*/false);
    }
    if (batch.size() == 1 && batch.front().job->job->task) {
      RunTask(batch.front());
      continue;
    }
    RunBatch(std::move(batch));
  }
}

std::vector<Batcher::Chunk> Batcher::TakeBatch(bool forwards_only) {
  auto is_task = [](const Chunk& chunk) { return static_cast<bool>(chunk.job->job->task); };
  // The cheapest queued request first (by its admission estimate; ties: the oldest), so
  // ordinary calls wait for about one batch, not behind every chunk of the costly requests
  // queued before them; but never twice in a row ahead of an older chunk (costly requests keep
  // going); then any later chunks of the same model version and extras that fit the token
  // budget. A task runs alone.
  auto first = queue_.begin();
  if (forwards_only) first = std::find_if_not(queue_.begin(), queue_.end(), is_task);
  if (first == queue_.end()) return {};
  auto seed = first;
  if (!light_went_ahead_ || forwards_only) {
    auto cheapest = queue_.end();
    for (auto it = first; it != queue_.end(); ++it) {
      if (is_task(*it)) continue;
      if (cheapest == queue_.end() || it->job->job->cost_bytes < cheapest->job->job->cost_bytes) {
        cheapest = it;
      }
    }
    if (cheapest != queue_.end()) seed = cheapest;
  }
  if (!forwards_only) light_went_ahead_ = seed != queue_.begin();
  std::vector<Chunk> batch;
  batch.push_back(std::move(*seed));
  queue_.erase(seed);
  if (is_task(batch.front())) return batch;
  int64_t tokens = batch.front().tokens;
  const Job& leader = *batch.front().job->job;
  for (auto it = queue_.begin(); it != queue_.end();) {
    const Job& candidate = *it->job->job;
    if (!is_task(*it) && candidate.model == leader.model &&
        SameExtras(candidate.forward, leader.forward) &&
        tokens + it->tokens <= options_.max_batch_tokens) {
      tokens += it->tokens;
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return batch;
}

void Batcher::RunTask(const Chunk& chunk) {
  const std::shared_ptr<JobState>& state = chunk.job;
  if (!StillWanted(state, "queue")) return;
  const auto start = Clock::now();
  state->started = true;
  state->output.queue_seconds = std::chrono::duration<double>(start - state->enqueued).count();
  metrics_->RecordQueueTime(state->output.queue_seconds);
  double others_seconds = 0;  // forward batches run from the task's yield points
  const std::function<bool()> yield = [&] {
    if (DropReason(*state->job) != nullptr) return true;
    // The forward batches queued now (not those arriving while they run: the task goes on).
    int64_t pending;
    {
      absl::MutexLock lock(&mutex_);
      pending = std::count_if(queue_.begin(), queue_.end(),
                              [](const Chunk& c) { return !c.job->job->task; });
    }
    const auto others_start = Clock::now();
    while (pending > 0) {
      std::vector<Chunk> batch;
      {
        absl::MutexLock lock(&mutex_);
        batch = TakeBatch(/*forwards_only=*/true);
      }
      if (batch.empty()) break;
      pending -= static_cast<int64_t>(batch.size());
      RunBatch(std::move(batch));
    }
    others_seconds += std::chrono::duration<double>(Clock::now() - others_start).count();
    return false;
  };
  absl::Status status = state->job->task(yield);
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count() - others_seconds;
  state->output.inference_seconds = seconds;
  metrics_->RecordInferenceTime(seconds);
  if (status.code() == absl::StatusCode::kCancelled && !StillWanted(state, "compute")) return;
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) {
    Log(LogLevel::kError, "engine task failed: %s", status.ToString());
  }
  Finish(state, std::move(status));
}

void Batcher::RunBatch(std::vector<Chunk> chunks) {
  // Drop what nobody waits for any more.
  std::vector<Chunk> live;
  for (Chunk& chunk : chunks) {
    if (StillWanted(chunk.job, "queue")) live.push_back(std::move(chunk));
  }
  if (live.empty()) return;

  // One engine call: concatenate sequences, keep the union of what the jobs asked for.
  std::vector<SequenceInput> sequences;
  ForwardOptions forward;
  forward.pool = false;
  std::set<int> hidden_layers, attention_layers;
  int64_t tokens = 0;
  const auto start = Clock::now();
  for (const Chunk& chunk : live) {
    const Job& job = *chunk.job->job;
    for (int i = chunk.begin; i < chunk.end; ++i) sequences.push_back(job.sequences[i]);
    // Attention maps only for the sequences of jobs that asked: a (heads, T, T) map per
    // sequence and layer for a whole batch of paragraphs runs into hundreds of MiB.
    forward.attention_sequences.insert(forward.attention_sequences.end(), chunk.end - chunk.begin,
                                       !job.forward.attention_layers.empty());
    hidden_layers.insert(job.forward.hidden_layers.begin(), job.forward.hidden_layers.end());
    attention_layers.insert(job.forward.attention_layers.begin(),
                            job.forward.attention_layers.end());
    forward.static_embeddings |= job.forward.static_embeddings;
    forward.attention_scores |= job.forward.attention_scores;
    forward.attention_qkv |= job.forward.attention_qkv;
    tokens += chunk.tokens;
    if (!chunk.job->started) {
      chunk.job->started = true;
      const double queued = std::chrono::duration<double>(start - chunk.job->enqueued).count();
      chunk.job->output.queue_seconds = queued;
      metrics_->RecordQueueTime(queued);
    }
  }
  forward.hidden_layers.assign(hidden_layers.begin(), hidden_layers.end());
  forward.attention_layers.assign(attention_layers.begin(), attention_layers.end());
  forward.attention_probs = true;
  // Between layers: stop once no request of the batch is wanted any more.
  forward.stop_requested = [&live] {
    for (const Chunk& chunk : live) {
      if (DropReason(*chunk.job->job) == nullptr) return false;
    }
    return true;
  };

  const Model& model = *live.front().job->job->model;
  absl::StatusOr<ForwardResult> result = model.Forward(sequences, forward);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  metrics_->RecordInferenceTime(seconds);
  metrics_->RecordBatch(static_cast<int64_t>(sequences.size()), tokens);
  metrics_->AddTokens(tokens);
  if (!result.ok() && result.status().code() == absl::StatusCode::kCancelled) {
    for (const Chunk& chunk : live) {
      if (StillWanted(chunk.job, "compute")) Finish(chunk.job, result.status());
    }
    return;
  }
  if (!result.ok()) {
    Log(LogLevel::kError, "engine batch of %d sequences failed: %s",
        static_cast<int>(sequences.size()), result.status().ToString());
    for (const Chunk& chunk : live) Finish(chunk.job, result.status());
    return;
  }
  auto shared = std::make_shared<const ForwardResult>(std::move(*result));
  int index = 0;
  for (const Chunk& chunk : live) {
    if (!StillWanted(chunk.job, "compute")) continue;
    JobState& state = *chunk.job;
    for (int i = chunk.begin; i < chunk.end; ++i) state.output.sequences[i] = {shared, index++};
    state.output.inference_seconds += seconds;
    state.output.batch_inputs =
        std::max(state.output.batch_inputs, static_cast<int>(sequences.size()));
    if (--state.remaining_chunks == 0) Finish(chunk.job, absl::OkStatus());
  }
}

}  // namespace attn::server
