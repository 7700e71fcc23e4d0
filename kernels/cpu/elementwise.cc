#include "kernels/cpu/elementwise.h"
