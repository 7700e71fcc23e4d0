#include "kernels/cpu/thread_pool.h"
