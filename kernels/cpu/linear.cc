#include "kernels/cpu/linear.h"
