// Which versions a model served by default before the one it serves now: what Rollback returns
// to. A change of the default (a promotion, SetServingVersion, a commit that serves, the newest
// version served on its own) puts the version served until then on top of the history; Rollback
// takes the version on top (or a named one further down, dropping those above it). A version
// committed staged and never promoted is never in it, so Rollback never serves it. A rollback to a
// version served once and rolled back from since is a change forward: the version it replaces
// goes on top.
//
// The registry keeps the history in memory (ModelRegistry::RestoreServingHistory); a model store
// records every change (engine/serving_state.h), and ReplayServingHistory rebuilds the history
// from that record at start and on each --watch-store poll.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "engine/serving_state.h"

namespace attn::server {

struct ServingHistory {
  std::vector<std::string> served_before;  // oldest first; back() is what Rollback serves
  std::set<std::string> served_ever;       // every version ever served by default
};

// The history a store's serving.json records. `committed` lists the model's versions in commit
// order (the base first). A store records changes only since its serving.json was made; before
// that the server served each commit as it was made, so the versions older than the first
// recorded one count as served, in commit order (unless the record may have lost its oldest
// entries: kMaxServingHistory of them).
ServingHistory ReplayServingHistory(const ServingState& state,
                                    const std::vector<std::string>& committed);

// The history of a store without serving.json: every version up to `serving` was served when
// it was committed, in commit order.
ServingHistory CommitOrderHistory(const std::vector<std::string>& committed,
                                  const std::string& serving);

}  // namespace attn::server
