// KL_HOST_DEVICE: a function both nvcc's device code and the host compiler use (plain C++ bodies
// only), so the CPU tests check what a kernel computes.
#pragma once

#if defined(__CUDACC__)
#define KL_HOST_DEVICE __host__ __device__
#else
#define KL_HOST_DEVICE
#endif
