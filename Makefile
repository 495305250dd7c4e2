# libllminfer build. `make` builds the libraries and tools that run on this
# machine's CPU; `make cuda` adds the GPU plug-in (cuda/cuda.mk); `make test`
# runs every test (and builds the plug-in when nvcc is found, to prove it
# compiles); `make check` runs them under ASan+UBSan and checks the ABI.

VERSION_MAJOR := 1
VERSION_MINOR := 4
VERSION_PATCH := 0
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)

CC ?= cc
PREFIX ?= /usr/local
DESTDIR ?=
BUILD ?= build
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_GEMMA3 := models/gemma-3-270m-q4_k_m.gguf
MODEL_MINILM := models/all-MiniLM-L6-v2

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
	-Wno-missing-field-initializers
OPT ?= -O2
CFLAGS ?= $(OPT) -g
ALL_CFLAGS := -std=c11 $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden -pthread \
	-D_GNU_SOURCE -Iinclude -Ilib
comma := ,
DEPS_LIBS := -lpcre2-8 -lcjson -lz -lm -ldl -pthread
ifeq ($(TSAN),1)
ALL_CFLAGS += -fsanitize=thread
LDSAN := -fsanitize=thread
endif
ifeq ($(SAN),1)
ALL_CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
endif

LIB_SRC := $(sort $(wildcard lib/*/*.c lib/*/*/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
SONAME := libllminfer.so.$(VERSION_MAJOR)
SHLIB := $(BUILD)/libllminfer.so.$(VERSION)
STLIB := $(BUILD)/libllminfer.a
# The same sources with the test hooks (core/core.h, "Test hooks") compiled
# in, for white-box tests only; the shared library and STLIB carry none.
TEST_HOOKS := -DLLMI_TEST_HOOKS
TEST_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj-test/%.o)
TESTLIB := $(BUILD)/libllminfer-test.a

UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
API_SRC := $(sort $(wildcard tests/api/test_*.c))
BACKEND_SRC := $(sort $(wildcard tests/backend/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit/%)
API_BIN := $(API_SRC:tests/api/%.c=$(BUILD)/tests/api/%)
BACKEND_BIN := $(BACKEND_SRC:tests/backend/%.c=$(BUILD)/tests/backend/%)

.PHONY: all run test check tsan install uninstall clean model format abi-update abi-check \
	bindings-test docs test-venv test-models \
	install-test bench bench-cpu bench-cpu-gemma3 bench-grammar deps-check model-gemma3
include cuda/cuda.mk

# The CUDA plug-in is not part of `all`: nvcc takes most of a first build and
# the plug-in only runs on a GPU. `make cuda`, `make install`, `make test`
# (hence `make check` and CI) and device-check build it when nvcc is found.
all: $(SHLIB) $(BUILD)/libllminfer.so $(STLIB) $(BUILD)/llm-run $(BUILD)/llm-bench $(BUILD)/llm-perplexity

# The library's own objects export the LLM_API functions (include/llm.h);
# programs and tests compile without LLM_BUILDING_LIBRARY.
LIB_DEFS := -DLLM_BUILDING_LIBRARY

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LIB_DEFS) -MMD -MP -c $< -o $@

$(BUILD)/obj-test/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LIB_DEFS) $(TEST_HOOKS) -MMD -MP -c $< -o $@

$(SHLIB): $(LIB_OBJ) lib/llminfer.map
	$(CC) -shared -o $@ $(LIB_OBJ) -Wl,-soname,$(SONAME) \
		-Wl,--version-script=lib/llminfer.map -Wl,--no-undefined $(LDSAN) $(DEPS_LIBS)

$(BUILD)/libllminfer.so: $(SHLIB)
	ln -sf libllminfer.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(STLIB): $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(TESTLIB): $(TEST_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/llm-run: examples/llm-run/main.c examples/common/progress_bar.h $(BUILD)/libllminfer.so
	$(CC) $(ALL_CFLAGS) $< -o $@ -L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib' \
		$(LDSAN)

# Teacher-forced perplexity on a text file (docs/bench.md, KV cache types).
$(BUILD)/llm-perplexity: examples/llm-perplexity/main.c examples/llm-perplexity/kld.c \
		examples/llm-perplexity/kld.h $(BUILD)/libllminfer.so
	$(CC) $(ALL_CFLAGS) $(filter %.c,$^) -o $@ -L$(BUILD) -lllminfer -lm \
		-Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib' $(LDSAN)

BENCH_SRC := $(sort $(wildcard examples/llm-bench/*.c))
$(BUILD)/llm-bench: $(BENCH_SRC) examples/llm-bench/bench.h $(BUILD)/libllminfer.so
	$(CC) $(ALL_CFLAGS) $(BENCH_SRC) -o $@ -L$(BUILD) -lllminfer -lm \
		-Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib' $(LDSAN)

# Synthetic load on SmolLM2 (docs/bench.md): continuous vs static batching on
# mixed lengths, and prefix cache on vs off for a 512-token shared prefix;
# prompt-lookup speculative decoding at batch 1 on repetitive and free prompts;
# embedding throughput (sentences/s) at batch 1 and 64.
bench: $(BUILD)/llm-bench $(BUILD)/llm-bench-cpu $(BUILD)/llm-quantize $(MODEL)
	@mkdir -p $(BUILD)/bench
	$(BUILD)/llm-bench -m $(MODEL) --requests 64 --prompt-len 16:128 --output-len 16:96 \
		--compare --json $(BUILD)/bench/mixed.json
	$(BUILD)/llm-bench -m $(MODEL) --requests 32 --prompt-len 16:64 --output-len 8:32 \
		--shared-prefix-len 512 --shared-prefix-frac 1.0 --compare \
		--json $(BUILD)/bench/prefix.json
	$(BUILD)/llm-bench -m $(MODEL) --spec ngram --workload repetitive --requests 4 \
		--json $(BUILD)/bench/spec-repetitive.json
	$(BUILD)/llm-bench -m $(MODEL) --spec ngram --workload free --requests 4 --output-len 96 \
		--json $(BUILD)/bench/spec-free.json
	$(BUILD)/llm-bench -m $(MODEL) --embed --requests 128 --prompt-len 8:48 \
		--json $(BUILD)/bench/embed.json
	@BUILD=$(BUILD) bash scripts/bench-cpu.sh --quick

# CPU speed versus llama.cpp on the same GGUF files (docs/bench.md): the
# full set, SmolLM2 in three types, random Llama-3.2-1B-shaped models and
# Gemma 3 270M.
# llama.cpp comes from PyPI (llama-cpp-python), built once into a venv
# outside the tree ($$LLAMA_VENV, default ~/.cache/llminfer/bench-venv).
bench-cpu: $(BUILD)/llm-bench-cpu $(BUILD)/llm-quantize $(MODEL) $(MODEL_GEMMA3)
	@BUILD=$(BUILD) bash scripts/bench-cpu.sh --full
# Gemma 3 270M alone (a few minutes).
bench-cpu-gemma3: $(BUILD)/llm-bench-cpu $(MODEL_GEMMA3)
	@BUILD=$(BUILD) bash scripts/bench-cpu.sh --gemma3

# Benchmark tools that use library internals link the static archive.
$(BUILD)/llm-bench-cpu: examples/llm-bench-cpu/main.c $(STLIB)
	$(CC) $(ALL_CFLAGS) $< -o $@ $(STLIB) $(LDSAN) $(DEPS_LIBS)

$(BUILD)/llm-quantize: examples/llm-quantize/main.c $(STLIB)
	$(CC) $(ALL_CFLAGS) $< -o $@ $(STLIB) $(LDSAN) $(DEPS_LIBS)

# Random-weight models of real shapes and a token-level benchmark on any
# backend, for `make device-check` (tests/tools/, docs/device-check.md).
$(BUILD)/llm-synth: tests/tools/synth.c $(STLIB)
	$(CC) $(ALL_CFLAGS) $< -o $@ $(STLIB) $(LDSAN) $(DEPS_LIBS)
# Generations under a grammar (tests/grammar/) and the grammar benchmark.
$(BUILD)/llm-grammar: tests/tools/grammar.c $(STLIB)
	$(CC) $(ALL_CFLAGS) $< -o $@ $(STLIB) $(LDSAN) $(DEPS_LIBS)
$(BUILD)/llm-devbench: tests/tools/devbench.c $(BUILD)/libllminfer.so
	$(CC) $(ALL_CFLAGS) $< -o $@ -L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN' $(LDSAN)

# One prepared run on a GPU machine (docs/device-check.md): builds, runs the
# tests on the GPU and benchmarks it in under 8 minutes, results in $$OUT
# (default build/device-check). DEVICE_CHECK_BACKEND=cpu runs the same flow
# on the CPU with tiny models.
.PHONY: device-check
device-check:
	@BUILD=$(BUILD) bash scripts/device-check.sh

# Nsight Compute per-kernel summaries of decode batch 1 (bf16, Q4_K), a
# 2048-token prefill and decode batch 64, one text file each, packed into
# $$OUT/device-profile.tar.gz (scripts/device-profile.sh).
.PHONY: device-profile
device-profile:
	@BUILD=$(BUILD) bash scripts/device-profile.sh

# What device-check runs, prebuilt for a GPU machine that cannot build
# (build/device-bundle; scripts/device-bundle.sh, docs/device-check.md).
.PHONY: device-bundle
device-bundle:
	@bash scripts/device-bundle.sh $(CUDA_ARCH)

# The main job: fetch the model, build, generate.
PROMPT ?= What is the capital of Germany?
run: all $(MODEL)
	$(BUILD)/llm-run -m $(MODEL) --chat -p "$(PROMPT)" -n 64

# Unit tests are white-box: they link the static archive with test hooks.
$(BUILD)/tests/unit/%: tests/unit/%.c $(TESTLIB) $(wildcard tests/unit/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_HOOKS) -Itests $< -o $@ $(TESTLIB) -lcmocka $(LDSAN) $(DEPS_LIBS)

# The backend conformance suite (docs/design.md) is white-box too: it drives
# engines on the backend named by LLM_TEST_BACKEND and on the CPU.
$(BUILD)/tests/backend/%: tests/backend/%.c tests/backend/conformance.c \
		tests/backend/conformance.h $(TESTLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_HOOKS) -Itests/backend $< tests/backend/conformance.c -o $@ \
		$(TESTLIB) -lcmocka $(LDSAN) $(DEPS_LIBS)

# Fake plug-ins for test_plugins (tests/plugins/fake_plugin.c), one per
# kind, built as a real plug-in is: no sanitizer, --no-undefined.
FAKE_PLUGIN_KINDS := probe ok version noentry null missing cpu other
FAKE_PLUGIN_DIR := $(BUILD)/tests/plugins
FAKE_PLUGINS := $(FAKE_PLUGIN_KINDS:%=$(FAKE_PLUGIN_DIR)/fake_%.so)
$(FAKE_PLUGIN_DIR)/fake_%.so: tests/plugins/fake_plugin.c lib/backend/plugin.h \
		lib/backend/backend.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) $(OPT) -g -fPIC -fvisibility=hidden -D_GNU_SOURCE -Iinclude -Ilib \
		-DFAKE_KIND_$* -shared $< -o $@ -Wl,--no-undefined
$(BUILD)/tests/unit/test_plugins: $(FAKE_PLUGINS)

# API tests are black-box: only llm.h and the shared library.
$(BUILD)/tests/api/%: tests/api/%.c $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $< -o $@ -L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN/../..' \
		-lcmocka $(LDSAN) -lm -pthread

# Tiny generated models (tests/models/README.md), written with the pinned
# Python packages of tests/requirements.txt into one venv for every build.
TEST_VENV := build/test-venv
TEST_MODELS := build/test-models
$(TEST_VENV)/.stamp: tests/requirements.txt
	@rm -rf $(TEST_VENV)
	python3 -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
	@touch $@
test-venv: $(TEST_VENV)/.stamp
# gen_tokenizers.py reads the SmolLM2 and Gemma 3 GGUF files (it skips a
# vocabulary whose file is absent); model-gemma3 fetches the Gemma 3 one,
# model-minilm the BERT folder gen_wordpiece.py reads.
test-models: $(TEST_VENV)/.stamp $(MODEL) model-gemma3 model-minilm
	@mkdir -p $(TEST_MODELS)
	@for g in $(sort $(wildcard tests/models/gen_*.py)); do \
		$(TEST_VENV)/bin/python $$g --out $(TEST_MODELS) || exit 1; \
	done

TEST_ENV := LLM_TEST_MODEL=$(abspath $(MODEL)) LLM_TEST_DATA=$(abspath tests) \
	LLM_TEST_TMP=$(abspath $(BUILD))/tmp LLM_TEST_MODELS=$(abspath $(TEST_MODELS)) \
	LLM_TEST_PYTHON=$(abspath $(TEST_VENV))/bin/python \
	LLM_TEST_MODEL_GEMMA3=$(abspath $(MODEL_GEMMA3)) \
	LLM_TEST_MODEL_MINILM=$(abspath $(MODEL_MINILM)) \
	LLM_PLUGIN_PATH=$(abspath $(BUILD)) LLM_TEST_PLUGINS=$(abspath $(FAKE_PLUGIN_DIR)) \
	LLM_TEST_CUDA_PLUGIN=$(if $(CUDA_PLUGIN),$(abspath $(CUDA_PLUGIN)))
# The engine tests (continuous batching, preemption, prefix cache, n
# samples, speculation, state, sliding windows, LoRA) run a second time on 2 CPU
# ranks of tensor parallelism, and the backend conformance suite on the tp
# backend (docs/tensor-parallel.md): both must give the CPU backend's results.
TP_TEST_BIN := $(addprefix $(BUILD)/tests/unit/,test_sched test_samples test_spec test_state \
	test_swakv test_lora_device)
test: all $(CUDA_PLUGIN) $(BUILD)/llm-serve $(UNIT_BIN) $(BACKEND_BIN) $(API_BIN) $(CUDA_TEST_BIN) \
		$(MODEL) $(MODEL_GEMMA3) test-models $(BUILD)/llm-synth $(BUILD)/llm-devbench \
		$(BUILD)/llm-grammar
	@mkdir -p $(BUILD)/tmp
	@bash tests/run-tests.sh "$(TEST_ENV)" $(UNIT_BIN) $(BACKEND_BIN) $(API_BIN) \
		$(CUDA_TEST_BIN) --env=LLM_TEST_TP=2 $(TP_TEST_BIN) \
		--env=LLM_TEST_BACKEND=tp2 $(BUILD)/tests/backend/test_conformance
	@bash tests/tools/test_cli.sh $(BUILD)
	@bash tests/tools/test_make_targets.sh
	+@$(MAKE) --no-print-directory test-grammar BUILD=$(BUILD)
	+@$(MAKE) --no-print-directory test-fp8 BUILD=$(BUILD)
	+@$(TEST_ENV) $(MAKE) --no-print-directory install-test BUILD=$(BUILD)
	$(if $(filter 1,$(SAN) $(TSAN)),,+@$(MAKE) --no-print-directory docs-test BUILD=$(BUILD))

# Every command and program that README.md and docs/ show, run in a scratch
# folder against this build (tests/tools/test_docs.py, docs/reliability.md
# "Docs that run"); blocks too slow for CI or needing a GPU are marked skip
# in the Markdown, with the reason, and listed. About a minute on 2 cores.
.PHONY: docs-test
docs-test: all $(CUDA_PLUGIN) $(BUILD)/llm-serve $(BUILD)/llm-quantize $(MODEL) $(MODEL_GEMMA3)
	@CUDA=$(CUDA) python3 tests/tools/test_docs.py --build $(BUILD)

# Structured output against independent references (tests/grammar/):
# generations under 53 JSON schemas validate with jsonschema (tiny random
# model, and SmolLM2 when its file is there), EBNF grammars and regular
# expressions agree with lark and Python's re. Under sanitizers SmolLM2 runs
# on every 10th schema only (a smoke: the whole pass takes minutes under
# ASan); `make check` runs the whole pass on the unsanitized build. The
# Llama-3-vocabulary file of bench-grammar tokenizes as tiktoken does
# (through the Python binding, so not in sanitized builds; skipped when the
# llama-models wheel cannot be fetched).
SCHEMAS_SMOKE := $(if $(filter 1,$(SAN) $(TSAN)),--real-every 10)
.PHONY: test-grammar
test-grammar: $(BUILD)/llm-grammar $(BUILD)/libllminfer.so $(TEST_VENV)/.stamp
	$(TEST_VENV)/bin/python tests/grammar/check_ebnf.py $(BUILD)
	$(if $(wildcard $(MODEL)),LLM_TEST_MODEL=$(abspath $(MODEL))) \
		$(TEST_VENV)/bin/python tests/grammar/check_schemas.py $(BUILD) $(SCHEMAS_SMOKE)
	$(if $(filter 1,$(SAN) $(TSAN)),,$(TEST_VENV)/bin/python tests/grammar/check_llama3_vocab.py $(BUILD))

# The FP8 KV cache's E4M3 codec against ml_dtypes on a million random
# floats (tests/golden/check_fp8.py; test_fp8 alone checks the committed
# golden table).
.PHONY: test-fp8
test-fp8: $(BUILD)/tests/unit/test_fp8 $(TEST_VENV)/.stamp
	$(TEST_VENV)/bin/python tests/golden/check_fp8.py $(BUILD)

# The grammar benchmark (docs/structured-output.md, "Measured"): llm-grammar
# bench over tests/grammar/schemas on SmolLM2 (49,152 tokens), on a
# random-weight model with Llama 3's 128,256-token vocabulary
# (scripts/make-llama3-vocab.py, written once; its first run downloads Meta's
# llama-models wheel from PyPI next to it) and on Gemma 3 (262,144) when its
# file is there; one JSON file per model in $(BUILD)/bench/grammar-*.json.
LLAMA3_VOCAB_MODEL := $(BUILD)/bench/models/llama3-vocab.gguf
GRAMMAR_BENCH = $(BUILD)/llm-grammar bench --schemas tests/grammar/schemas --walks 2
$(LLAMA3_VOCAB_MODEL): scripts/make-llama3-vocab.py $(TEST_VENV)/.stamp
	$(TEST_VENV)/bin/python scripts/make-llama3-vocab.py $@
bench-grammar: $(BUILD)/llm-grammar $(LLAMA3_VOCAB_MODEL) | $(MODEL)
	@mkdir -p $(BUILD)/bench
	$(GRAMMAR_BENCH) --model $(MODEL) >$(BUILD)/bench/grammar-smollm2.json.tmp
	@mv $(BUILD)/bench/grammar-smollm2.json.tmp $(BUILD)/bench/grammar-smollm2.json
	$(GRAMMAR_BENCH) --model $(LLAMA3_VOCAB_MODEL) >$(BUILD)/bench/grammar-llama3-vocab.json.tmp
	@mv $(BUILD)/bench/grammar-llama3-vocab.json.tmp $(BUILD)/bench/grammar-llama3-vocab.json
	$(if $(wildcard $(MODEL_GEMMA3)),$(GRAMMAR_BENCH) --model $(MODEL_GEMMA3) \
		>$(BUILD)/bench/grammar-gemma3.json.tmp && \
		mv $(BUILD)/bench/grammar-gemma3.json.tmp $(BUILD)/bench/grammar-gemma3.json)
	@ls $(BUILD)/bench/grammar-*.json

# The module order (docs/design.md), the thread-sanitized concurrency test,
# the whole suite under ASan+UBSan in its own build folder (its summary line
# is the suite's), the ABI checks, the API reference, the language bindings
# against an installed copy of the (unsanitized) library, and llm-serve's
# end-to-end tests (examples/llm-serve/serve.mk).
check:
	$(MAKE) --no-print-directory deps-check
	$(MAKE) --no-print-directory tsan
	$(MAKE) --no-print-directory BUILD=build/san SAN=1 OPT=-O1 test
	$(MAKE) --no-print-directory abi-check
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory bindings-test
	$(MAKE) --no-print-directory serve-test
	$(MAKE) --no-print-directory test-grammar
	$(MAKE) --no-print-directory docs-test

# Includes and calls between lib/ modules only run down the order in
# docs/design.md, "Module order" (known exceptions: tests/deps/allowed.txt),
# and no new circle between the files of one module (tests/deps/file_cycles.txt).
deps-check: $(LIB_OBJ)
	@python3 tests/deps/check.py --objects $(BUILD)/obj
	@python3 tests/deps/file_cycles.py --objects $(BUILD)/obj

# Submit/cancel from several threads while one steps, under ThreadSanitizer.
tsan:
	$(MAKE) --no-print-directory BUILD=build/tsan TSAN=1 OPT=-O1 build/tsan/tests/unit/test_sched
	@mkdir -p build/tsan/tmp
	@bash tests/run-tests.sh "LLM_TEST_TMP=$(abspath build/tsan/tmp) \
		LLM_TEST_FILTER=test_concurrent* TSAN_OPTIONS=halt_on_error=1" \
		build/tsan/tests/unit/test_sched

abi-check: $(SHLIB)
	@bash tests/abi/check.sh $(SHLIB)

abi-update: $(SHLIB)
	@bash tests/abi/check.sh --update $(SHLIB)

# The user tools: each finds the installed library through its rpath
# ($ORIGIN/../lib). llm-serve needs libmicrohttpd (scripts/install-deps.sh).
INSTALL_TOOLS := llm-run llm-serve llm-bench llm-quantize
# llminfer.pc's Libs carry an rpath to the installed library, so a program
# built with `pkg-config --libs llminfer` runs from any PREFIX without
# LD_LIBRARY_PATH; /usr/lib is on the loader's path and needs none.
PC_RPATH := $(if $(filter /usr /usr/,$(PREFIX)),,-Wl$(comma)-rpath$(comma)$${libdir} )
install: all $(CUDA_PLUGIN) $(INSTALL_TOOLS:%=$(BUILD)/%)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/llm.h $(DESTDIR)$(PREFIX)/include/llm.h
	install -m 755 $(SHLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libllminfer.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libllminfer.so
	install -m 644 $(STLIB) $(DESTDIR)$(PREFIX)/lib/
	$(if $(CUDA_PLUGIN),install -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/)
	install -m 755 $(INSTALL_TOOLS:%=$(BUILD)/%) $(DESTDIR)$(PREFIX)/bin/
	for pc in llminfer llminfer-static; do \
		sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
			-e 's|@RPATH@|$(PC_RPATH)|g' \
			pkgconfig/$$pc.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/$$pc.pc || exit 1; \
	done

# The API reference from include/llm.h (Doxygen; a warning fails it).
docs:
	@rm -rf $(BUILD)/docs && mkdir -p $(BUILD)/docs
	@( cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $(BUILD)/docs/api"; \
		echo "WARN_LOGFILE = $(BUILD)/docs/warnings.log" ) | doxygen - || \
		{ cat $(BUILD)/docs/warnings.log >&2; exit 1; }
	@echo "API reference: $(BUILD)/docs/api/html/index.html"

# The Python, Go and Rust bindings' suites against an installed copy
# (tests/bindings/run.sh; docs/bindings/).
bindings-test: all $(MODEL)
	@bash tests/bindings/run.sh $(BUILD) $(MODEL)

# Installs into a scratch prefix and builds a downstream program with pkg-config.
install-test:
	+@LLM_CUDA_PLUGIN="$(CUDA_PLUGIN)" bash tests/install/run.sh $(BUILD) "$(CC)" "$(LDSAN)"

model: $(MODEL)
$(MODEL): scripts/fetch-model.sh
	@bash scripts/fetch-model.sh smollm2 $@
# Gemma 3 270M, Q4_K_M (about 250 MB; docs/architectures.md).
.PHONY: model-gemma3
model-gemma3: $(MODEL_GEMMA3)
$(MODEL_GEMMA3): scripts/fetch-model.sh
	@bash scripts/fetch-model.sh gemma3 $@
# sentence-transformers all-MiniLM-L6-v2, a BERT encoder as a Hugging Face
# folder (about 85 MB; docs/models.md).
.PHONY: model-minilm
model-minilm: $(MODEL_MINILM)/model.safetensors
$(MODEL_MINILM)/model.safetensors: scripts/fetch-model.sh
	@bash scripts/fetch-model.sh minilm $(MODEL_MINILM)

format:
	clang-format -i include/llm.h $(LIB_SRC) $(wildcard lib/*/*.h) examples/*/*.c \
		$(UNIT_SRC) $(API_SRC) $(wildcard tests/backend/*.[ch])

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/llm.h $(DESTDIR)$(PREFIX)/lib/libllminfer.so* \
		$(DESTDIR)$(PREFIX)/lib/libllminfer.a $(DESTDIR)$(PREFIX)/lib/libllminfer-cuda.so \
		$(INSTALL_TOOLS:%=$(DESTDIR)$(PREFIX)/bin/%) \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/llminfer.pc \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig/llminfer-static.pc

clean:
	rm -rf build

# ---- Fuzzing (docs/reliability.md) ----
# libFuzzer targets built with clang; the library sources are compiled with
# the fuzz flags (test hooks included) into build/fuzz/obj (not the gcc-built
# archive). Each run works on a copy of the committed seed corpus in
# build/fuzz/corpus-<target> and saves crashes under build/fuzz/artifacts-<target>/.
#   make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="gguf model"]
#   make fuzz-smoke     (CI: regressions, then 10 s per target)
#   make fuzz-regress   (every fuzzer once over its corpus and regressions)
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= gguf model tokenize chat state safetensors hf_tokenizer jinja grammar lora kld
FUZZ_DIR := build/fuzz
# UBSan stops at the first report through UBSAN_OPTIONS=halt_on_error=1
# (FUZZ_ENV), not -fno-sanitize-recover: with -g, clang 14 takes minutes per
# SIMD kernel file in that mode (over 400 s for kernels_q8_x86.c).
FUZZ_CFLAGS := -std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
	-pthread -D_GNU_SOURCE -Iinclude -Ilib -Itests/fuzz $(TEST_HOOKS)
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
FUZZ_BIN := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_MAXLEN_gguf := 65536
FUZZ_MAXLEN_model := 65536
FUZZ_MAXLEN_tokenize := 4096
FUZZ_MAXLEN_chat := 4096
FUZZ_MAXLEN_state := 16384
FUZZ_MAXLEN_safetensors := 16384
FUZZ_MAXLEN_hf_tokenizer := 16384
FUZZ_MAXLEN_jinja := 8192
FUZZ_MAXLEN_lora := 16384
FUZZ_MAXLEN_kld := 16384
FUZZ_ENV := LLM_TEST_TMP=$(abspath $(FUZZ_DIR))/tmp \
	$(if $(wildcard $(MODEL)),LLM_TEST_MODEL=$(abspath $(MODEL))) \
	ASAN_OPTIONS=detect_leaks=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The slowest inputs of a healthy target run in well under a second.
FUZZ_OPTS := -timeout=20 -rss_limit_mb=4096 -print_final_stats=1

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-regress fuzz-corpus
$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(LIB_DEFS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) -o $@ $(DEPS_LIBS)

# fuzz_state and the corpus generator share the model of fuzz_state.h.
$(FUZZ_DIR)/fuzz_state: tests/fuzz/fuzz_state.h
$(FUZZ_DIR)/fuzz_lora: tests/fuzz/fuzz_lora.h
$(FUZZ_DIR)/fuzz_kld: examples/llm-perplexity/kld.c examples/llm-perplexity/kld.h

fuzz-build: $(FUZZ_LIB_OBJ) $(FUZZ_BIN)

fuzz: fuzz-build
	@mkdir -p $(FUZZ_DIR)/tmp
	@set -e; for t in $(FUZZ_TARGETS); do \
		c=$(FUZZ_DIR)/corpus-$$t; a=$(FUZZ_DIR)/artifacts-$$t; \
		mkdir -p $$c $$a; \
		cp -n tests/fuzz/corpus/$$t/* tests/fuzz/regressions/$$t/* $$c/ 2>/dev/null || true; \
		d=; [ -f tests/fuzz/$$t.dict ] && d=-dict=tests/fuzz/$$t.dict; \
		echo "==> fuzz_$$t for $(FUZZ_SECONDS)s"; \
		env $(FUZZ_ENV) $(FUZZ_DIR)/fuzz_$$t $(FUZZ_OPTS) $$d \
			-max_total_time=$(FUZZ_SECONDS) -max_len=$$(case $$t in \
			gguf) echo $(FUZZ_MAXLEN_gguf);; model) echo $(FUZZ_MAXLEN_model);; \
			tokenize) echo $(FUZZ_MAXLEN_tokenize);; state) echo $(FUZZ_MAXLEN_state);; \
			safetensors) echo $(FUZZ_MAXLEN_safetensors);; \
			hf_tokenizer) echo $(FUZZ_MAXLEN_hf_tokenizer);; lora) echo $(FUZZ_MAXLEN_lora);; \
			*) echo $(FUZZ_MAXLEN_chat);; esac) \
			-artifact_prefix=$$a/ $$c 2>&1 | tee $(FUZZ_DIR)/fuzz_$$t.log | \
			grep -E "^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|==[0-9]+==ERROR|SUMMARY|.*check failed)" || true; \
		if grep -qE 'ERROR: libFuzzer|==[0-9]+==ERROR|check failed|SUMMARY: (Address|Undefined|Leak)' \
			$(FUZZ_DIR)/fuzz_$$t.log; then \
			echo "fuzz_$$t FAILED: see $(FUZZ_DIR)/fuzz_$$t.log and $$a/"; exit 1; fi; \
	done

# Each fuzzer runs every file of its seed corpus and regressions once.
fuzz-regress: fuzz-build
	@mkdir -p $(FUZZ_DIR)/tmp
	@set -e; for t in $(FUZZ_TARGETS); do \
		files=$$(ls -d tests/fuzz/corpus/$$t/* tests/fuzz/regressions/$$t/* 2>/dev/null || true); \
		[ -n "$$files" ] || continue; \
		echo "==> fuzz_$$t: $$(echo $$files | wc -w) corpus and regression inputs"; \
		env $(FUZZ_ENV) $(FUZZ_DIR)/fuzz_$$t $(FUZZ_OPTS) $$files \
			>$(FUZZ_DIR)/regress_$$t.log 2>&1 || \
			{ tail -n 40 $(FUZZ_DIR)/regress_$$t.log; echo "fuzz_$$t: regression FAILED"; exit 1; }; \
	done

fuzz-smoke: fuzz-regress
	+@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=10

# Regenerates the committed seed corpora (the one rule that writes there).
fuzz-corpus: $(TESTLIB)
	@mkdir -p $(FUZZ_DIR)
	$(CC) $(ALL_CFLAGS) $(TEST_HOOKS) tests/fuzz/make_corpus.c -o $(FUZZ_DIR)/make_corpus \
		$(TESTLIB) $(LDSAN) $(DEPS_LIBS)
	$(FUZZ_DIR)/make_corpus tests/fuzz/corpus

-include $(FUZZ_LIB_OBJ:.o=.d)

-include $(LIB_OBJ:.o=.d)
-include $(TEST_OBJ:.o=.d)
include examples/llm-serve/serve.mk
