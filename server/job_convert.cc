#include "server/job_convert.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "server/fine_tune_convert.h"
#include "server/request_parse.h"

namespace attn::server {

namespace v1 = attnserve::v1;

absl::StatusOr<core::JobSpec> ToCore(const v1::JobSpec& spec) {
  absl::StatusOr<core::FineTuneConfig> config = ToCore(spec.config());
  if (!config.ok()) return config.status();
  core::JobSpec out;
  out.config = *std::move(config);
  out.epochs = spec.epochs();
  out.batch_size = spec.batch_size();
  out.description = spec.description();
  out.promote = spec.promote();
  out.dataset.bytes = spec.dataset().bytes();
  out.dataset.examples = spec.dataset().examples();
  out.dataset.sha256 = spec.dataset().sha256();
  return out;
}

v1::JobState ToProto(core::JobState state) {
  // The core's states carry the protocol's numbers.
  return static_cast<v1::JobState>(static_cast<int>(state));
}

void ToProto(const core::JobView& view, v1::Job* out) {
  const core::JobRecord& r = view.record;
  out->set_job_id(r.id);
  out->set_model(r.model);
  out->set_state(ToProto(r.state));
  out->set_created_utc(r.created_utc);
  out->set_started_utc(r.started_utc);
  out->set_ended_utc(r.ended_utc);
  out->set_base_version(r.base_version);
  out->set_objective(r.objective);
  out->set_epochs(r.epochs);
  out->set_batch_size(r.batch_size);
  out->set_step(r.step);
  out->set_total_steps(r.total_steps);
  out->set_loss(r.loss);
  v1::DatasetInfo* dataset = out->mutable_dataset();
  dataset->set_bytes(r.dataset.bytes);
  dataset->set_examples(r.dataset.examples);
  dataset->set_sha256(r.dataset.sha256);
  out->set_description(r.description);
  out->set_promote(r.promote);
  out->set_committed_version(r.committed_version);
  out->set_promoted(r.promoted);
  out->set_promotion(r.promotion);
  out->set_error(r.error);
  out->set_error_code(r.error_code);
  out->set_queue_position(view.queue_position);
  out->set_events(view.events);
}

core::JobCodec JobProtoCodec() {
  core::JobCodec codec;
  codec.decode_example = [](std::string_view bytes) -> absl::StatusOr<core::TrainingExample> {
    v1::TrainingExample example;
    bool parsed;
    {
      google::protobuf::LogSilencer quiet;  // the client gets the reason, not the log
      parsed = example.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
    }
    if (!parsed) {
      google::protobuf::io::ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()));
      absl::Status problem = DescribeUnparsableMessage(*v1::TrainingExample::descriptor(), &input,
                                                       static_cast<int64_t>(bytes.size()));
      return absl::InvalidArgumentError(
          problem.ok() ? "not a valid attnserve.v1.TrainingExample"
                       : absl::StrReplaceAll(problem.message(), {{"the request is", "it is"}}));
    }
    return ToCore(example);
  };
  codec.encode_event = [](const core::JobEvent& event) {
    v1::JobEvent out;
    out.set_index(event.index);
    out.set_time_utc(event.time_utc);
    out.set_state(ToProto(event.state));
    out.set_message(event.message);
    if (event.progress.has_value()) ToProto(*event.progress, out.mutable_progress());
    return out.SerializeAsString();
  };
  return codec;
}

}  // namespace attn::server
