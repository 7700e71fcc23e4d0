#include "engine/checkpoint.h"
