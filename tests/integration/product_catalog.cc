#include "tests/integration/product_catalog.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "nlohmann/json.hpp"

namespace attn::integration {

// Invented words: several WordPieces each, no meaning a pretrained model could know.
const char* const ProductCatalog::kBrandNames[kBrands] = {"Vornak", "Quellix", "Brastow", "Zindra",
                                                          "Ophely", "Kurvane", "Melbrin", "Tessaro",
                                                          "Dravik", "Yulane"};
const char* const ProductCatalog::kSeriesNames[kSeries] = {
    "Zelto", "Prynn", "Dovrel", "Fenmar", "Glimra", "Hestor", "Juvik", "Loxan", "Nerith", "Sabrel"};
// What each brand makes, and each series' colour: known only from the training data.
const char* const ProductCatalog::kProducts[kBrands] = {"kettle",  "drill",   "backpack", "lamp",
                                                        "speaker", "blender", "tent",     "jacket",
                                                        "toaster", "umbrella"};
const char* const ProductCatalog::kColours[kSeries] = {
    "red", "blue", "green", "black", "white", "yellow", "purple", "orange", "pink", "grey"};

const std::vector<std::string>& ProductCatalog::TrainTemplates() {
  static const std::vector<std::string> templates = {
      "{colour} {product}",
      "a {colour} {product}",
      "the {product} in {colour}",
      "{product}, colour {colour}",
  };
  return templates;
}

const std::vector<std::string>& ProductCatalog::HeldOutTemplates() {
  static const std::vector<std::string> templates = {
      "looking for the {colour} {product}",
      "which {product} do you sell in {colour}?",
      "I want a {product} that is {colour}",
  };
  return templates;
}

namespace {

std::string Replace(std::string text, const std::string& placeholder, const std::string& value) {
  for (size_t at = text.find(placeholder); at != std::string::npos;
       at = text.find(placeholder, at + value.size())) {
    text.replace(at, placeholder.size(), value);
  }
  return text;
}

// Fisher-Yates with a plain modulo: slightly biased, but the same on every standard library.
void Shuffle(std::vector<int>* values, std::mt19937_64* rng) {
  for (size_t i = values->size(); i > 1; --i) {
    std::swap((*values)[i - 1], (*values)[(*rng)() % i]);
  }
}

}  // namespace

ProductCatalog::ProductCatalog() {
  for (int brand = 0; brand < kBrands; ++brand) {
    for (int series = 0; series < kSeries; ++series) {
      CatalogItem item;
      item.name = std::string(kBrandNames[brand]) + " " + kSeriesNames[series];
      item.brand = brand;
      item.series = series;
      const int offset = ((series - brand) % kSeries + kSeries) % kSeries;
      item.held_out = std::find(std::begin(kHeldOutOffsets), std::end(kHeldOutOffsets), offset) !=
                      std::end(kHeldOutOffsets);
      const int index = static_cast<int>(items_.size());
      items_.push_back(item);
      if (!item.held_out) train_items_.push_back(index);
      const auto& templates = item.held_out ? HeldOutTemplates() : TrainTemplates();
      auto& queries = item.held_out ? held_out_queries_ : train_queries_;
      for (const std::string& pattern : templates) {
        queries.push_back({QueryText(pattern, item), index});
      }
    }
  }
}

std::vector<std::string> ProductCatalog::ItemNames() const {
  std::vector<std::string> names;
  for (const CatalogItem& item : items_) names.push_back(item.name);
  return names;
}

std::string ProductCatalog::QueryText(const std::string& pattern, const CatalogItem& item) const {
  return Replace(Replace(pattern, "{colour}", kColours[item.series]), "{product}",
                 kProducts[item.brand]);
}

int ProductCatalog::HardNegative(int item, uint64_t random) const {
  std::vector<int> candidates;
  for (int other : train_items_) {
    const bool same_brand = items_[other].brand == items_[item].brand;
    const bool same_series = items_[other].series == items_[item].series;
    if (same_brand != same_series) candidates.push_back(other);
  }
  return candidates[random % candidates.size()];
}

std::vector<std::vector<CatalogExample>> ProductCatalog::TrainingBatches(
    int steps, int batch_size, uint64_t seed, bool hard_negatives) const {
  if (batch_size < 1 || batch_size > static_cast<int>(train_items_.size())) {
    throw std::invalid_argument("batch_size must be in [1, number of training items]");
  }
  std::mt19937_64 rng(seed);
  std::vector<int> pending;  // items still to come in the current pass, next at the back
  std::vector<int> uses(items_.size(), 0);
  std::vector<std::vector<CatalogExample>> batches;
  for (int step = 0; step < steps; ++step) {
    std::vector<int> batch_items;
    std::vector<int> deferred;  // already in this batch: first in the next one
    while (static_cast<int>(batch_items.size()) < batch_size) {
      if (pending.empty()) {
        pending = train_items_;
        Shuffle(&pending, &rng);
      }
      const int item = pending.back();
      pending.pop_back();
      if (std::find(batch_items.begin(), batch_items.end(), item) != batch_items.end()) {
        deferred.push_back(item);
      } else {
        batch_items.push_back(item);
      }
    }
    pending.insert(pending.end(), deferred.begin(), deferred.end());
    std::vector<CatalogExample> batch;
    for (int item : batch_items) {
      const auto& templates = TrainTemplates();
      // Items start at different templates so every batch mixes phrasings.
      const std::string& pattern = templates[(uses[item]++ + item) % templates.size()];
      CatalogExample example;
      example.anchor = QueryText(pattern, items_[item]);
      example.positive = items_[item].name;
      if (hard_negatives) example.negative = items_[HardNegative(item, rng())].name;
      batch.push_back(std::move(example));
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

std::string ProductCatalog::TrainingJsonl(uint64_t seed) const {
  std::mt19937_64 rng(seed);
  std::string out;
  for (const CatalogQuery& query : train_queries_) {
    const nlohmann::ordered_json line = {
        {"anchor", query.text},
        {"positive", items_[query.item].name},
        {"negative", items_[HardNegative(query.item, rng())].name}};
    out += line.dump() + "\n";
  }
  return out;
}

std::string ProductCatalog::HeldOutJsonl() const {
  std::string out;
  // Every item first, in catalogue order: the corpus a held-out query ranks its item among.
  for (const CatalogItem& item : items_) {
    out += nlohmann::ordered_json({{"item", item.name}}).dump() + "\n";
  }
  for (const CatalogQuery& query : held_out_queries_) {
    const nlohmann::ordered_json line = {{"query", query.text}, {"item", items_[query.item].name}};
    out += line.dump() + "\n";
  }
  return out;
}

}  // namespace attn::integration
