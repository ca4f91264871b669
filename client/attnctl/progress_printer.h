// A fine-tuning job's progress on the terminal, for 'attnctl finetune' (the job on the client's
// stream) and 'attnctl job watch' (a server-side job's events, replayed then live): a live bar on
// a terminal, else a line every --log-every steps, or every message as JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "attnserve/v1/trainer.pb.h"
#include "client/fine_tune_runner.h"

namespace attn::client::attnctl {

// "0:07", "12:34", "1:02:03"; "?" when not known.
std::string FormatDuration(double seconds);

// "committed version V (staged: ...)" and the server's word on the promotion.
void PrintCommitted(FILE* out, const std::string& version, bool promoted,
                    const std::string& promotion);

// The job's shape, as the progress lines show it.
struct ProgressPlan {
  int epochs = 1;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t log_every = 1;  // lines mode: a line on step 1, every log_every-th and the last
};

// When a step happened, as far as the printer is told.
struct StepTiming {
  // Seconds from the job's start to the step; NaN when not known.
  double elapsed_s = std::numeric_limits<double>::quiet_NaN();
  // The step happened before the watch began (a replayed event): its line shows when it
  // happened and no ETA, which the pace of a replay would only make up.
  bool replayed = false;
};

// Shows progress on stderr (a live bar on a terminal, else a line every log_every steps, with the
// matrices that moved most under it) or every message as JSON on stdout. The runner serialises
// the calls.
class ProgressPrinter final : public FineTuneObserver {
 public:
  enum class Mode { kBar, kLines, kJson };

  ProgressPrinter(ProgressPlan plan, Mode mode);

  Mode mode() const { return mode_; }
  // Seconds since the printer was made.
  double Elapsed() const;

  // FineTuneObserver: a message of the client's own job, timed by the client's clock.
  void OnProgress(const attnserve::v1::FineTuneProgress& p, bool new_step) override;
  void OnEvent(FineTuneEvent event) override;
  // A message with its timing (job watch: from the event's time on the server).
  void OnStep(const attnserve::v1::FineTuneProgress& p, bool new_step, const StepTiming& timing);

  // One line per evaluation the message carries.
  void PrintEvaluations(const attnserve::v1::FineTuneProgress& p);
  // "recall@1 0.000 -> 0.850, mrr@10 ..." from the base's evaluation to the last one; "" when
  // there were fewer than two.
  std::string EvaluationChange() const;
  // Ends the bar's line (before other output, and at the end).
  void BreakLine();

 private:
  using Clock = std::chrono::steady_clock;

  void PrintLine(const attnserve::v1::FineTuneProgress& p, const StepTiming& timing,
                 Clock::time_point now);
  void DrawBar(const attnserve::v1::FineTuneProgress& p, const StepTiming& timing,
               Clock::time_point now);
  // "epoch 1/2  loss 0.4123  lr 1.60e-05  312.4 ex/s  ETA 0:42" (lines: with the step first and
  // the elapsed time).
  std::string Status(const attnserve::v1::FineTuneProgress& p, const StepTiming& timing,
                     Clock::time_point now) const;

  const ProgressPlan plan_;
  const Mode mode_;
  const Clock::time_point start_;
  // The first live step and when it arrived: the pace (and ETA) is measured from it, as the
  // first step includes the job's set-up.
  int64_t first_step_ = -1;
  Clock::time_point first_time_;
  Clock::time_point last_draw_;
  bool bar_visible_ = false;  // a progress bar is on the terminal's line above the current one
  std::string most_changed_;  // the last telemetry's summary, shown under the bar
  // Lines mode: the last telemetry not yet printed, and its step; printed under the next
  // progress line, so --log-every governs both.
  std::string pending_most_changed_;
  int64_t pending_most_changed_step_ = 0;
  attnserve::v1::EvaluationResult first_evaluation_, last_evaluation_;
};

}  // namespace attn::client::attnctl
