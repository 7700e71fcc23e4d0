#include "kernels/cpu/sampling.h"
