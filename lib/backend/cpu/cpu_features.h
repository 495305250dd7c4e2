/* CPU features and the process-wide kernel level: the one place that asks
 * the CPU what it can do.
 *
 * A leaf of the backend: it includes no kernel header, and every kernel
 * file (portable, SIMD, dispatch) asks it which level runs, so there is one
 * answer for the whole process.
 *
 * Contract: all functions are thread-safe (relaxed atomics; the values are
 * indexes into constant tables, so any valid value a thread sees is fine).
 * llmi_kernels_set_level changes which kernels run: call it only while no
 * kernel runs (tests use it to compare paths). */
#ifndef LLMI_CPU_FEATURES_H
#define LLMI_CPU_FEATURES_H

/* Kernel levels: 0 portable C, 1 AVX2+FMA+F16C, 2 AVX-512F (whose integer
 * kernels use AVX-512 VNNI when the CPU has it with AVX-512BW/VL, and level
 * 1's otherwise: llmi_kernels_int_level). */
#define LLMI_KLEVEL_C 0
#define LLMI_KLEVEL_AVX2 1
#define LLMI_KLEVEL_AVX512 2
#define LLMI_KLEVEL_COUNT 3

#if defined(__x86_64__) && defined(__GNUC__)
/* The SIMD kernel files are compiled (each function with its own target
 * attribute; the library is built without -march flags). */
#define LLMI_KERNELS_X86 1
#endif

/* Clamps to what the CPU supports; a negative level selects the best. */
void llmi_kernels_set_level(int level);
/* The current level (the best one until set_level is called). */
int llmi_kernels_level(void);
/* The best level this CPU supports. */
int llmi_kernels_best_level(void);

/* Whether the integer kernels of level 2 use AVX-512 VNNI on this CPU. */
int llmi_kernels_have_vnni(void);
/* The level whose integer (8-bit activation) kernels run: the current level,
 * except that level 2 without VNNI runs level 1's. */
int llmi_kernels_int_level(void);

#endif
