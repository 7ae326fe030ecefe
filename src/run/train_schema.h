#pragma once
// Every key `lathe train` accepts, with its type, default and meaning. This table is the
// contract users write configs against (README, configs/*.yaml); the keys train.steps,
// train.log_interval, checkpoint.interval, checkpoint.keep_last, data.path and data.tokenizer are
// stable by promise. Names follow GPT-NeoX where it has one.

#include "io/config.h"

namespace lathe {

// The schema, built once per call (cheap); Config keeps a pointer to it, so keep it alive.
ConfigSchema train_config_schema();

}  // namespace lathe
