#include "client/attnctl/progress_printer.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/attnctl/common.h"

namespace attn::client::attnctl {
namespace {

namespace v1 = ::attnserve::v1;

int TerminalColumns() {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

int Digits(int64_t n) { return static_cast<int>(absl::StrCat(n).size()); }

std::string CodePointPrefix(const std::string& s, int n) {
  std::string out;
  int cp = -1;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++cp;
    if (cp >= n) break;
    out.push_back(c);
  }
  return out;
}

// "most changed: layers.5.value 1.2e-03, layers.4.query 9.8e-04, ...; 212 embedding rows
// touched": the groups that moved most since the job started, from a telemetry message.
std::string MostChanged(const v1::TrainingTelemetry& telemetry, int count) {
  std::vector<const v1::ParameterGroupTelemetry*> groups;
  for (const v1::ParameterGroupTelemetry& g : telemetry.groups()) groups.push_back(&g);
  const size_t shown = std::min<size_t>(count, groups.size());
  std::partial_sort(
      groups.begin(), groups.begin() + shown, groups.end(),
      [](const auto* a, const auto* b) { return a->relative_change() > b->relative_change(); });
  std::string line = "most changed:";
  for (size_t i = 0; i < shown; ++i) {
    absl::StrAppendFormat(&line, "%s %s %.1e", i == 0 ? "" : ",", groups[i]->name(),
                          groups[i]->relative_change());
  }
  if (telemetry.embedding_rows_touched() > 0) {
    absl::StrAppendFormat(&line, "; %d embedding rows touched", telemetry.embedding_rows_touched());
  }
  return line;
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

void PrintCommitted(FILE* out, const std::string& version, bool promoted,
                    const std::string& promotion) {
  if (promoted) {
    std::fprintf(out,
                 "committed version %s (promoted: now served by default; 'attnctl "
                 "rollback' undoes)\n",
                 version.c_str());
  } else {
    std::fprintf(out,
                 "committed version %s (staged: not served by default; try it with "
                 "--model-version %s, then 'attnctl promote --version %s')\n",
                 version.c_str(), version.c_str(), version.c_str());
  }
  if (!promotion.empty()) std::fprintf(out, "%s\n", promotion.c_str());
}

ProgressPrinter::ProgressPrinter(ProgressPlan plan, Mode mode)
    : plan_(plan), mode_(mode), start_(Clock::now()) {}

double ProgressPrinter::Elapsed() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void ProgressPrinter::OnProgress(const v1::FineTuneProgress& p, bool new_step) {
  OnStep(p, new_step, StepTiming{Elapsed(), false});
}

void ProgressPrinter::OnStep(const v1::FineTuneProgress& p, bool new_step,
                             const StepTiming& timing) {
  for (const v1::EvaluationResult& e : p.evaluations()) {
    if (first_evaluation_.metrics_size() == 0) first_evaluation_ = e;
    last_evaluation_ = e;
  }
  if (mode_ == Mode::kJson) {
    PrintJson(p);
    std::fflush(stdout);
    return;
  }
  if (!new_step) return PrintEvaluations(p);
  const auto now = Clock::now();
  if (first_step_ < 0 && !timing.replayed) {
    first_step_ = p.step();
    first_time_ = now;
  }
  if (mode_ == Mode::kLines) {
    PrintLine(p, timing, now);
    return PrintEvaluations(p);
  }
  PrintEvaluations(p);  // above the bar, which is redrawn under them
  if (p.has_telemetry()) most_changed_ = MostChanged(p.telemetry(), 3);
  DrawBar(p, timing, now);
}

// Lines mode: on step 1, every log_every-th step and the last, a progress line and under it the
// last telemetry that came since the line before.
void ProgressPrinter::PrintLine(const v1::FineTuneProgress& p, const StepTiming& timing,
                                Clock::time_point now) {
  const int64_t step = p.step();
  if (p.has_telemetry()) {
    pending_most_changed_ = MostChanged(p.telemetry(), 5);
    pending_most_changed_step_ = step;
  }
  if (step != 1 && step % std::max<int64_t>(1, plan_.log_every) != 0 && step < plan_.total_steps) {
    return;
  }
  std::fprintf(stderr, "%s\n", Status(p, timing, now).c_str());
  if (pending_most_changed_.empty()) return;
  const std::string at = pending_most_changed_step_ == step
                             ? ""
                             : absl::StrCat(" (at step ", pending_most_changed_step_, ")");
  std::fprintf(stderr, "  %s%s\n", pending_most_changed_.c_str(), at.c_str());
  pending_most_changed_.clear();
}

void ProgressPrinter::DrawBar(const v1::FineTuneProgress& p, const StepTiming& timing,
                              Clock::time_point now) {
  const int64_t step = p.step();
  // Redraw at most 10 times a second, and always for the last step.
  if (step < plan_.total_steps && p.evaluations_size() == 0 && last_draw_ != Clock::time_point() &&
      now - last_draw_ < std::chrono::milliseconds(100)) {
    return;
  }
  last_draw_ = now;
  const std::string status = Status(p, timing, now);
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
  // The bar, and under it the matrices that moved most (redrawn in place).
  std::string table = most_changed_;
  if (DisplayWidth(table) > columns - 1) table = CodePointPrefix(table, columns - 1);
  if (bar_visible_) std::fprintf(stderr, "\033[1A");
  std::fprintf(stderr, "\r%s\033[K\n%s\033[K", line.c_str(), table.c_str());
  std::fflush(stderr);
  bar_visible_ = true;
}

void ProgressPrinter::OnEvent(FineTuneEvent event) {
  BreakLine();
  const char* note = "disconnecting";
  if (event == FineTuneEvent::kAbortingOnInterrupt) {
    note =
        "interrupted: aborting the job after the current step (Ctrl-C again to disconnect at "
        "once)";
  } else if (event == FineTuneEvent::kCommitPending) {
    note = "the commit was already requested; waiting for it (Ctrl-C again to disconnect)";
  }
  std::fprintf(stderr, "attnctl: %s\n", note);
}

void ProgressPrinter::PrintEvaluations(const v1::FineTuneProgress& p) {
  for (const v1::EvaluationResult& e : p.evaluations()) {
    BreakLine();
    std::fprintf(stderr, "evaluation %s: %s\n",
                 e.step() == 0 ? "of the base" : absl::StrCat("after step ", e.step()).c_str(),
                 FormatMetrics(e).c_str());
  }
}

std::string ProgressPrinter::EvaluationChange() const {
  if (first_evaluation_.step() == last_evaluation_.step() ||
      first_evaluation_.metrics_size() != last_evaluation_.metrics_size()) {
    return "";
  }
  std::vector<std::string> parts;
  for (int i = 0; i < last_evaluation_.metrics_size(); ++i) {
    parts.push_back(absl::StrFormat("%s %.4f \u2192 %.4f", last_evaluation_.metrics(i).name(),
                                    first_evaluation_.metrics(i).value(),
                                    last_evaluation_.metrics(i).value()));
  }
  return absl::StrFormat("evaluation (%d examples, step 0 \u2192 %d): %s",
                         last_evaluation_.examples(), last_evaluation_.step(),
                         absl::StrJoin(parts, ", "));
}

void ProgressPrinter::BreakLine() {
  if (bar_visible_) {
    std::fputc('\n', stderr);
    bar_visible_ = false;
  }
}

std::string ProgressPrinter::Status(const v1::FineTuneProgress& p, const StepTiming& timing,
                                    Clock::time_point now) const {
  const int64_t step = p.step();
  const int64_t epoch =
      plan_.steps_per_epoch > 0
          ? std::min<int64_t>(plan_.epochs,
                              (std::max<int64_t>(step, 1) - 1) / plan_.steps_per_epoch + 1)
          : 1;
  std::string s;
  if (mode_ == Mode::kLines) s = absl::StrFormat("step %d/%d  ", step, plan_.total_steps);
  absl::StrAppendFormat(&s, "epoch %d/%d  loss %.4f  lr %.2e  %.1f ex/s", epoch, plan_.epochs,
                        p.loss(), p.learning_rate(), p.examples_per_second());
  if (mode_ == Mode::kLines && std::isfinite(timing.elapsed_s)) {
    absl::StrAppend(&s, "  elapsed ", FormatDuration(timing.elapsed_s));
  }
  if (timing.replayed) return s;  // when it happened is all a replayed step can say
  // ETA from the pace since the first live step (the first step includes the job's set-up),
  // else from the time the steps so far took.
  double eta = std::numeric_limits<double>::quiet_NaN();
  const double since_first = std::chrono::duration<double>(now - first_time_).count();
  if (step > first_step_ && first_step_ >= 0 && since_first > 0) {
    eta = (plan_.total_steps - step) * since_first / (step - first_step_);
  } else if (step > 0 && std::isfinite(timing.elapsed_s) && timing.elapsed_s > 0) {
    eta = (plan_.total_steps - step) * timing.elapsed_s / step;
  }
  absl::StrAppend(&s, "  ETA ", step >= plan_.total_steps ? "0:00" : FormatDuration(eta));
  return s;
}

}  // namespace attn::client::attnctl
