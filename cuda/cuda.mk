# The CUDA backend plug-in (cuda/, docs/design.md "The backend ops table"):
# build/libllminfer-cuda.so, built whenever nvcc is found; `make CUDA=0`
# skips it. It is linked with cuBLASLt and the static CUDA runtime; the core
# never links CUDA and loads the plug-in with dlopen (lib/backend/plugin.c).
#   cuda/*.c    host code, compiled by $(CC) as C11 (may include the core's
#               headers: backend.h, model.h)
#   cuda/*.cu   kernels and their launchers, compiled by nvcc as C++17;
#               they include only cuda/ headers and llm.h
#   tests/cuda/test_*.cu   host tests built by nvcc (they run without a GPU,
#               kernel tests skip), linked with the kernels' objects and the
#               test archive for the CPU reference code

# Included above the Makefile's first rule: its rules must not become the
# default goal.
.DEFAULT_GOAL := all

# FLASHINFER=1 builds the plug-in with FlashInfer's attention (off by
# default; docs/cuda.md, "FlashInfer attention").
FLASHINFER ?= 0
FLASHINFER_DIR ?= build/flashinfer
FLASHINFER_STAMP := $(FLASHINFER_DIR)/.fetched

NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(strip $(NVCC)),)
CUDA ?= 0
else
CUDA ?= 1
endif

ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
# Ampere and Hopper machine code, and PTX for later chips.
CUDA_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
NVCC_FLAGS := -std=c++17 -O3 -g -lineinfo $(CUDA_GENCODE) -Xcompiler -fPIC \
	-Xcompiler -fvisibility=hidden -Xcompiler -Wall -Iinclude -Ilib -Icuda \
	-DLLM_EXPERIMENTAL
CUDA_CFLAGS := -std=c11 $(WARN) $(OPT) -g -fPIC -fvisibility=hidden -pthread -D_GNU_SOURCE \
	-Iinclude -Ilib -Icuda -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_LIBDIR) -lcublasLt -lcudart_static -ldl -lrt -lpthread -lm

# A sanitized build's tests link the sanitizers' runtimes; nvcc splits
# -Xcompiler values at commas, so each sanitizer goes on its own.
NVCC_LDSAN := $(foreach s,$(subst $(comma), ,$(patsubst -fsanitize=%,%,$(LDSAN))), \
	-Xcompiler -fsanitize=$(s))

CUDA_C_SRC := $(sort $(wildcard cuda/*.c))
CUDA_CU_SRC := $(sort $(wildcard cuda/*.cu))
# FLASHINFER=1: cuda/attention_flashinfer.cu, built on FlashInfer's headers
# (fetched into FLASHINFER_DIR, above); otherwise its stand-in
# cuda/attention_flashinfer_off.c, which takes nothing.
ifeq ($(FLASHINFER),1)
CUDA_C_SRC := $(filter-out cuda/attention_flashinfer_off.c,$(CUDA_C_SRC))
FLASHINFER_NVCC_FLAGS := -isystem $(FLASHINFER_DIR)/include
$(BUILD)/obj-cuda/cuda/attention_flashinfer.cu.o: $(FLASHINFER_STAMP)
$(BUILD)/obj-cuda/cuda/attention_flashinfer.cu.o: NVCC_FLAGS += $(FLASHINFER_NVCC_FLAGS)
else
CUDA_CU_SRC := $(filter-out cuda/attention_flashinfer.cu,$(CUDA_CU_SRC))
FLASHINFER_NVCC_FLAGS :=
endif
# Holds the FLASHINFER value of the last build, rewritten when it changes,
# so that switching it relinks the plug-in and the CUDA tests even when the
# other file's object is older than they are.
CUDA_FLASHINFER_MODE := $(BUILD)/obj-cuda/flashinfer-mode
$(shell mkdir -p $(BUILD)/obj-cuda && { [ "$$(cat $(CUDA_FLASHINFER_MODE) 2>/dev/null)" = \
	"$(FLASHINFER)" ] || echo "$(FLASHINFER)" >$(CUDA_FLASHINFER_MODE); })
CUDA_OBJ := $(CUDA_C_SRC:%.c=$(BUILD)/obj-cuda/%.o) $(CUDA_CU_SRC:%.cu=$(BUILD)/obj-cuda/%.cu.o)
CUDA_PLUGIN := $(BUILD)/libllminfer-cuda.so
CUDA_TEST_SRC := $(sort $(wildcard tests/cuda/test_*.cu))
CUDA_TEST_BIN := $(CUDA_TEST_SRC:tests/cuda/%.cu=$(BUILD)/tests/cuda/%)
# tests/cuda/test_*.c: host tests of the plug-in's pure host code (cuda/layout.c,
# cuda/tp_shard.c, cuda/upload.c, cuda/lora_plan.c),
# C like the files they test
CUDA_TEST_C_SRC := $(sort $(wildcard tests/cuda/test_*.c))
CUDA_TEST_BIN += $(CUDA_TEST_C_SRC:tests/cuda/%.c=$(BUILD)/tests/cuda/%)
CUDA_HOST_OBJ := $(BUILD)/obj-cuda/cuda/layout.o $(BUILD)/obj-cuda/cuda/tp_shard.o \
	$(BUILD)/obj-cuda/cuda/upload.o $(BUILD)/obj-cuda/cuda/lora_plan.o

$(BUILD)/obj-cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj-cuda/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

# Linked by the host compiler: --no-undefined proves the plug-in needs
# nothing of the core but the services it is handed (backend/plugin.h).
$(CUDA_PLUGIN): $(CUDA_OBJ) $(CUDA_FLASHINFER_MODE)
	$(CXX) -shared -o $@ $(CUDA_OBJ) -Wl,--no-undefined -Wl,--exclude-libs,ALL $(CUDA_LIBS)

# Host tests link the plug-in's objects (they call its kernels' launchers
# and its host functions directly) and the test archive (the CPU reference).
$(BUILD)/tests/cuda/%: tests/cuda/%.cu $(CUDA_OBJ) $(TESTLIB) $(wildcard cuda/*.h) \
		$(wildcard tests/cuda/*.h) $(CUDA_FLASHINFER_MODE)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -Itests/unit $< -o $@ $(CUDA_OBJ) $(TESTLIB) -lcmocka \
		$(filter-out -pthread,$(DEPS_LIBS)) -Xcompiler -pthread -L$(CUDA_LIBDIR) -lcublasLt -ldl \
		$(NVCC_LDSAN)

$(BUILD)/tests/cuda/%: tests/cuda/%.c $(CUDA_HOST_OBJ) $(TESTLIB) $(wildcard cuda/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) $(TEST_HOOKS) -Itests $< -o $@ $(CUDA_HOST_OBJ) $(TESTLIB) -lcmocka \
		$(DEPS_LIBS) $(LDSAN)

# Registers, shared memory, stack and spills of every kernel for sm_90
# (cuda/ptxas-report.sh); fails when a GEMV, attention, batch-invariant
# matmul or LoRA kernel spills.
# make test runs it.
CUDA_PTXAS_REPORT := $(BUILD)/cuda-ptxas.txt
$(CUDA_PTXAS_REPORT): $(CUDA_CU_SRC) $(wildcard cuda/*.h) cuda/ptxas-report.sh \
		$(if $(filter 1,$(FLASHINFER)),$(FLASHINFER_STAMP))
	@mkdir -p $(dir $@)
	@bash cuda/ptxas-report.sh $(NVCC) sm_90 $(CUDA_CU_SRC) -- -std=c++17 -O3 \
		-Iinclude -Ilib -Icuda -DLLM_EXPERIMENTAL $(FLASHINFER_NVCC_FLAGS) >$@.tmp || { cat $@.tmp; rm -f $@.tmp; exit 1; }
	@mv $@.tmp $@
.PHONY: cuda-ptxas
cuda-ptxas: $(CUDA_PTXAS_REPORT)
	@cat $<
test: $(CUDA_PTXAS_REPORT)

# Standalone GPU benchmarks (cuda/bench/, not part of the plug-in): the
# floors `make device-check` compares its figures with.
CUDA_BENCH_BIN := $(BUILD)/cuda-bench-bandwidth
$(BUILD)/cuda-bench-bandwidth: cuda/bench/bandwidth.cu
	$(NVCC) $(NVCC_FLAGS) $< -o $@ -L$(CUDA_LIBDIR) -lcublasLt

-include $(CUDA_OBJ:.o=.d)
else
CUDA_PLUGIN :=
CUDA_TEST_BIN :=
CUDA_BENCH_BIN :=
endif

.PHONY: cuda cuda-ptxas
cuda: $(CUDA_PLUGIN)

# FlashInfer's headers (flashinfer-python, pinned with its sha256 in the
# script; Apache-2.0), fetched, never committed: `make flashinfer`, and by
# `make cuda FLASHINFER=1` before the file that includes them. One copy for
# every BUILD folder.
$(FLASHINFER_STAMP): scripts/fetch-flashinfer.sh
	@bash scripts/fetch-flashinfer.sh $(FLASHINFER_DIR)
.PHONY: flashinfer
flashinfer: $(FLASHINFER_STAMP)
