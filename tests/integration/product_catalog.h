// A made-up product catalogue: a small retrieval task that a pretrained encoder cannot solve and
// that fine-tuning can learn in a few dozen steps, for the "it learns" integration test.
//
// Every item is named "<brand> <series>" from invented words ("Vornak Zelto"). Unknown to any
// pretrained model, each brand makes one kind of product and each series is one colour, so
// "Vornak Zelto" is a red kettle. A query describes what the customer wants in plain words
// ("a red kettle") and must retrieve the item's name among all items' names: the base model can
// only guess, since nothing but the training data links "kettle" to "Vornak" and "red" to
// "Zelto".
//
// Held-out evaluation is separate from training on two counts, so it measures what was
// generalised rather than what was memorised:
//  * held-out items: 2 of each brand's 10 series (so each brand and each series still appears
//    in training, with other partners) never occur in the training data, not even as
//    negatives: retrieving them needs the brand -> product and series -> colour meanings
//    combined in a way never seen;
//  * held-out phrasings: held-out queries use templates that no training query uses.
//
// Everything is deterministic: the same seed gives the same batches on every platform (own
// shuffle on std::mt19937_64, no <random> distributions, whose output is library-specific).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::integration {

struct CatalogItem {
  std::string name;  // "Vornak Zelto": the text retrieval must find
  int brand = 0;     // index into ProductCatalog::kProducts (what the brand makes)
  int series = 0;    // index into ProductCatalog::kColours (the series' colour)
  bool held_out = false;
};

struct CatalogQuery {
  std::string text;  // "looking for the red kettle"
  int item = 0;      // index into ProductCatalog::items()
};

// One line of a contrastive training set: anchor = a query, positive = its item's name,
// negative = the name of another training item with the same brand or the same series.
struct CatalogExample {
  std::string anchor, positive, negative;
};

class ProductCatalog {
 public:
  static constexpr int kBrands = 10;
  static constexpr int kSeries = 10;
  // Items (b, s) with (s - b) mod kSeries in this set are held out: 2 per brand and per series.
  static constexpr int kHeldOutOffsets[] = {0, 5};
  static const char* const kBrandNames[kBrands];
  static const char* const kSeriesNames[kSeries];
  static const char* const kProducts[kBrands];
  static const char* const kColours[kSeries];
  // "{colour}" and "{product}" are replaced.
  static const std::vector<std::string>& TrainTemplates();
  static const std::vector<std::string>& HeldOutTemplates();

  ProductCatalog();

  // kBrands * kSeries items, brand-major.
  const std::vector<CatalogItem>& items() const { return items_; }
  std::vector<std::string> ItemNames() const;
  // Every training item with every training template.
  const std::vector<CatalogQuery>& train_queries() const { return train_queries_; }
  // Every held-out item with every held-out template.
  const std::vector<CatalogQuery>& held_out_queries() const { return held_out_queries_; }

  // `steps` batches of `batch_size` (<= the number of training items) examples. Within a batch
  // the items are distinct, so no in-batch negative is secretly a positive; over consecutive
  // batches every training item comes once per pass in a seeded order, and an item's queries
  // cycle through the training templates. Without `hard_negatives` the negatives stay empty.
  std::vector<std::vector<CatalogExample>> TrainingBatches(int steps, int batch_size, uint64_t seed,
                                                           bool hard_negatives) const;

  // JSON Lines for `attnctl finetune --objective contrastive`: every training query with its
  // item and a hard negative, one {"anchor","positive","negative"} per line.
  std::string TrainingJsonl(uint64_t seed) const;
  // The held-out evaluation set in the retrieval format of `attnctl eval` and `--eval-data`:
  // every item as {"item"} (the corpus, in catalogue order), then one {"query","item"} per
  // held-out query. examples/catalog/ ships both files (JsonlExport checks they are current).
  std::string HeldOutJsonl() const;

 private:
  std::string QueryText(const std::string& pattern, const CatalogItem& item) const;
  // A training item sharing exactly one of item's brand and series, chosen by `random`.
  int HardNegative(int item, uint64_t random) const;

  std::vector<CatalogItem> items_;
  std::vector<int> train_items_;
  std::vector<CatalogQuery> train_queries_, held_out_queries_;
};

}  // namespace attn::integration
