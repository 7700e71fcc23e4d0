#include "engine/make_model.h"
