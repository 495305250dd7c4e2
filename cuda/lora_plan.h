/* The host side of the CUDA backend's LoRA updates (lora.c), free of CUDA
 * so that host tests run it without a GPU:
 *   grouping  a step's rows by adapter, as S-LoRA and Punica batch them:
 *             each adapter's kernels run over its own rows only, and rows
 *             without an adapter are never listed (so never touched);
 *   layout    where each targeted pair's A and B lie in the one device
 *             allocation an adapter is uploaded into. */
#ifndef LLMI_CUDA_LORA_PLAN_H
#define LLMI_CUDA_LORA_PLAN_H

#include "model/adapter.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Offset of a pair that its adapter does not have. */
#define LLMI_CUDA_LORA_ABSENT SIZE_MAX

/* Floats each matrix start is aligned to: 16 bytes, so that the shrink
 * kernel's 128-bit loads stay aligned. */
#define LLMI_CUDA_LORA_ALIGN 4

/* Groups rows 0 .. n_rows-1 by row_adapter (0: none, a + 1: adapter a <
 * n_adapters): rows[seg[a] .. seg[a + 1]) are adapter a's rows, ascending;
 * seg has n_adapters + 1 entries, seg[0] = 0, and seg[n_adapters] is the
 * number of rows with an adapter (rows has room for n_rows). false, with
 * nothing meaningful written, when a row names an adapter >= n_adapters. */
bool llmi_cuda_lora_group(const uint32_t *row_adapter, uint32_t n_rows, uint32_t n_adapters,
                          uint32_t *rows, uint32_t *seg);

/* The device layout of adapter `a` over n_layer layers, in floats:
 * off[2 * (layer * LLMI_LORA_TARGETS + t)] is where pair (layer, t)'s A
 * ([rank][in]) starts and off[... + 1] its B ([rank][out]), each a multiple
 * of LLMI_CUDA_LORA_ALIGN, pairs in (layer, target) order, A before B, no
 * overlap; LLMI_CUDA_LORA_ABSENT for both when the pair is absent. *total
 * is the floats to allocate. false when the sizes overflow size_t. */
bool llmi_cuda_lora_layout(const llm_adapter *a, uint32_t n_layer, size_t *off, size_t *total);

#endif
