#include "kernels/cpu/attention.h"
