/* CPU feature detection and the kernel level (cpu_features.h). */
#include "backend/cpu/cpu_features.h"

#include <stdatomic.h>

#if defined(LLMI_KERNELS_X86)
#include <cpuid.h>
#endif

/* -1 until first use. */
static atomic_int g_best = -1;
static atomic_int g_level = -1;
static atomic_int g_vnni = -1;

int llmi_kernels_best_level(void) {
    int best = atomic_load_explicit(&g_best, memory_order_relaxed);
    if (best >= 0)
        return best;
    best = LLMI_KLEVEL_C;
#if defined(LLMI_KERNELS_X86)
    /* __builtin_cpu_supports also checks that the OS saves the AVX and
     * AVX-512 register state (XCR0). Clang's does not know "f16c", so that
     * bit comes from CPUID leaf 1 (OS support is the same as AVX's). */
    unsigned a = 0, b = 0, c = 0, d = 0;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        best = LLMI_KLEVEL_AVX2;
        if (__builtin_cpu_supports("avx512f"))
            best = LLMI_KLEVEL_AVX512;
    }
#endif
    atomic_store_explicit(&g_best, best, memory_order_relaxed);
    return best;
}

void llmi_kernels_set_level(int level) {
    int best = llmi_kernels_best_level();
    if (level < 0 || level > best)
        level = best;
    atomic_store_explicit(&g_level, level, memory_order_relaxed);
}

int llmi_kernels_level(void) {
    int level = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (level < 0) {
        level = llmi_kernels_best_level();
        atomic_store_explicit(&g_level, level, memory_order_relaxed);
    }
    return level;
}

int llmi_kernels_have_vnni(void) {
    int v = atomic_load_explicit(&g_vnni, memory_order_relaxed);
    if (v >= 0)
        return v;
    v = 0;
#if defined(LLMI_KERNELS_X86)
    __builtin_cpu_init();
    v = llmi_kernels_best_level() >= LLMI_KLEVEL_AVX512 && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#endif
    atomic_store_explicit(&g_vnni, v, memory_order_relaxed);
    return v;
}

int llmi_kernels_int_level(void) {
    const int level = llmi_kernels_level();
    return level == LLMI_KLEVEL_AVX512 && !llmi_kernels_have_vnni() ? LLMI_KLEVEL_AVX2 : level;
}
