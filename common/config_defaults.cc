#include "common/config_defaults.h"

#include <cstdint>

#include "common/model_spec.h"

namespace cserps {

void ApplyDefaults(v1::JobConfig* config) {
  v1::ClusterConfig* cluster = config->mutable_cluster();
  if (cluster->max_message_bytes() == 0) {
    cluster->set_max_message_bytes(4u << 20);
  }
  if (cluster->round_timeout_s() == 0) cluster->set_round_timeout_s(60);
  if (cluster->max_step_lag() == 0) cluster->set_max_step_lag(8);
  if (cluster->retained_rounds() == 0) cluster->set_retained_rounds(4);
  if (cluster->local_size() == 0) cluster->set_local_size(1);

  v1::ModelConfig* model = config->mutable_model();
  // Only a CNN gets the conv defaults: other kinds must leave them unset, and
  // their fingerprints stay what they were before CNNs existed.
  if (model->kind() == v1::ModelConfig::CNN) {
    if (model->conv_channels_size() == 0) {
      for (uint32_t c : kDefaultConvChannels) model->add_conv_channels(c);
    }
    if (model->kernel_size() == 0) model->set_kernel_size(kDefaultKernelSize);
    if (model->image_height() == 0) {
      model->set_image_height(kDefaultImageHeight);
    }
    if (model->image_width() == 0) model->set_image_width(kDefaultImageWidth);
    if (model->image_channels() == 0) {
      model->set_image_channels(kDefaultImageChannels);
    }
    // A wrapped product is left for validation to report as a mismatch.
    if (model->input_dim() == 0) {
      model->set_input_dim(model->image_height() * model->image_width() *
                           model->image_channels());
    }
  }
  if (model->input_dim() == 0) model->set_input_dim(784);
  if (model->num_classes() == 0) model->set_num_classes(10);

  v1::DataConfig* data = config->mutable_data();
  if (data->dir().empty()) data->set_dir("/usr/share/datasets/fashion-mnist");

  v1::OptimizerConfig* optimizer = config->mutable_optimizer();
  if (optimizer->momentum_kind() == v1::OptimizerConfig::MOMENTUM_UNSPECIFIED) {
    optimizer->set_momentum_kind(v1::OptimizerConfig::NONE);
  }
  if (optimizer->schedule() == v1::OptimizerConfig::SCHEDULE_UNSPECIFIED) {
    optimizer->set_schedule(v1::OptimizerConfig::CONSTANT);
  }

  v1::AlgorithmConfig* algorithm = config->mutable_algorithm();
  if (algorithm->name().empty()) algorithm->set_name("ssgd");
  if (algorithm->block_size() == 0) algorithm->set_block_size(1024);

  if (config->log_every_steps() == 0) config->set_log_every_steps(50);
  if (config->evals_per_epoch() == 0) config->set_evals_per_epoch(1);
  if (config->output_dir().empty()) config->set_output_dir("out");
  // Only a job that checkpoints gets the section: the fingerprints of the
  // others stay what they were before checkpoints existed.
  if (config->has_checkpoint() && config->checkpoint().keep() == 0) {
    config->mutable_checkpoint()->set_keep(2);
  }
}

}  // namespace cserps
