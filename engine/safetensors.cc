#include "engine/safetensors.h"
