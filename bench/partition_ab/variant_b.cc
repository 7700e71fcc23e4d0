// The other side of partition_ab: the decode partition kernel of BATON_AB_SOURCE
// (by default this tree's attention_decode.cc) under names of its own, so
// two versions of the kernel link into one program.
#define attend_decode_partition attend_decode_partition_b
#define decode_partition_supported decode_partition_supported_b
#define decode_partition_start decode_partition_start_b
#ifndef BATON_AB_SOURCE
#define BATON_AB_SOURCE "kernels/cpu/attention_decode.cc"
#endif
#include BATON_AB_SOURCE
