#include "engine/model_config.h"
