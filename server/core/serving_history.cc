#include "server/core/serving_history.h"

#include <algorithm>

namespace attn::server {
namespace {

// `current` stops being the default and `next` becomes it.
void Serve(const std::string& next, std::string* current, ServingHistory* history) {
  history->served_ever.insert(next);
  if (next == *current) return;
  if (!current->empty()) history->served_before.push_back(*current);
  *current = next;
}

// A rollback to `target`: the versions served after it leave the history, and so does
// `target` itself, which is served again. A target not in the history (served once, then rolled
// back from) is a change forward like any other.
void RollBack(const std::string& target, std::string* current, ServingHistory* history) {
  std::vector<std::string>& before = history->served_before;
  auto found = std::find(before.rbegin(), before.rend(), target);
  if (found == before.rend()) return Serve(target, current, history);
  before.erase(std::next(found).base(), before.end());
  history->served_ever.insert(target);
  *current = target;
}

}  // namespace

ServingHistory CommitOrderHistory(const std::vector<std::string>& committed,
                                  const std::string& serving) {
  ServingHistory history;
  std::string current;
  for (const std::string& version : committed) {
    Serve(version, &current, &history);
    if (version == serving) return history;
  }
  // The served version is not among the committed ones: only it is known to have been served.
  history = ServingHistory();
  history.served_ever.insert(serving);
  return history;
}

ServingHistory ReplayServingHistory(const ServingState& state,
                                    const std::vector<std::string>& committed) {
  ServingHistory history;
  std::string current;
  if (!state.history.empty() && !state.history.front().from.empty()) {
    const std::string& first = state.history.front().from;
    const bool complete = state.history.size() < kMaxServingHistory;
    const bool listed = std::find(committed.begin(), committed.end(), first) != committed.end();
    if (complete && listed) {
      history = CommitOrderHistory(committed, first);
      current = first;
    } else {
      Serve(first, &current, &history);
    }
  }
  for (const ServingChange& change : state.history) {
    if (change.to.empty()) continue;  // a staged commit: the default did not change
    if (change.action == "rollback") {
      RollBack(change.to, &current, &history);
    } else {
      Serve(change.to, &current, &history);
    }
  }
  if (!state.serving.empty()) Serve(state.serving, &current, &history);
  return history;
}

}  // namespace attn::server
