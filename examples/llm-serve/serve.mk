# llm-serve: the OpenAI-compatible HTTP server (docs/serve.md), its tests,
# fuzzer and benchmark. Included from the top-level Makefile.
#   make build/llm-serve     the server (needs libmicrohttpd and libcjson)
#   make serve-venv          the openai client in $(BUILD)/serve-venv (README)
#   make serve-test          end-to-end tests on loopback (tests/serve/run.sh)
#   make serve-test-san      the same with the server under ASan+UBSan
#   make fuzz-serve [FUZZ_SERVE_SECONDS=30]   the request-parsing fuzzer (clang)
#   make fuzz-serve-regress  the fuzzers (requests, --devices) once over their seeds
#   make build/tests/serve/test_tool_parse   tool-call parsing (no model; run.sh runs it)
#   make bench-serve         load test; JSON under build/bench/
SERVE_SRC := $(sort $(wildcard examples/llm-serve/*.c))
SERVE_HDR := $(wildcard examples/llm-serve/*.h) examples/common/progress_bar.h
SERVE_PKGS := libmicrohttpd libcjson
SERVE_CFLAGS = $(shell pkg-config --cflags $(SERVE_PKGS))
SERVE_LIBS = $(shell pkg-config --libs $(SERVE_PKGS))

.PHONY: serve serve-test serve-test-san serve-venv fuzz-serve fuzz-serve-regress bench-serve
serve: $(BUILD)/llm-serve

$(BUILD)/llm-serve: $(SERVE_SRC) $(SERVE_HDR) $(BUILD)/libllminfer.so
	$(CC) $(ALL_CFLAGS) $(SERVE_CFLAGS) $(SERVE_SRC) -o $@ -L$(BUILD) -lllminfer $(SERVE_LIBS) \
		-lm -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../lib' $(LDSAN)

# The official openai client (pinned in tests/requirements.txt) in
# $(BUILD)/serve-venv, for the README's example and the tests.
serve-venv:
	BUILD=$(BUILD) tests/serve/run.sh --venv-only

serve-test: $(BUILD)/llm-serve $(BUILD)/llm-run $(BUILD)/tests/serve/test_tool_parse $(MODEL)
	BUILD=$(BUILD) tests/serve/run.sh

# The same tests with the server under ASan+UBSan (the library as built).
SERVE_SAN_BIN := $(BUILD)/serve-san/llm-serve
$(SERVE_SAN_BIN): $(SERVE_SRC) $(SERVE_HDR) $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
		-fno-sanitize-recover=undefined $(SERVE_CFLAGS) $(SERVE_SRC) -o $@ -L$(BUILD) -lllminfer \
		$(SERVE_LIBS) -lm -Wl,-rpath,'$$ORIGIN/..' -fsanitize=address,undefined

serve-test-san: $(SERVE_SAN_BIN) $(BUILD)/llm-run $(BUILD)/tests/serve/test_tool_parse $(MODEL)
	BUILD=$(BUILD) LLM_SERVE_BIN=$(SERVE_SAN_BIN) ASAN_OPTIONS=detect_leaks=1 tests/serve/run.sh

# The fuzzer links only the request translation (and its allocator), cJSON and the library (for
# the params initialisers): no model, no HTTP. It is built here rather than
# by the fuzz section of the Makefile because it needs cJSON and request.c.
FUZZ_SERVE_SECONDS ?= 30
FUZZ_SERVE_DIR := $(BUILD)/fuzz-serve
# The request's fields (request.c), its structured-output and tool fields
# (structured.c, tools.c) and the tool-call reply parser (tool_parse.c).
FUZZ_SERVE_REQUEST_SRC := examples/llm-serve/request.c examples/llm-serve/structured.c \
	examples/llm-serve/tools.c examples/llm-serve/tool_parse.c examples/llm-serve/alloc.c
$(FUZZ_SERVE_DIR)/fuzz_serve_request: tests/serve/fuzz_serve_request.c $(FUZZ_SERVE_REQUEST_SRC) \
		$(SERVE_HDR) $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Iexamples/llm-serve $(SERVE_CFLAGS) -fsanitize=fuzzer $< \
		$(FUZZ_SERVE_REQUEST_SRC) -o $@ $(shell pkg-config --libs libcjson) \
		-L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN/..' -lm -pthread

# Tool-call parsing, format detection and grammar text: no model needed.
$(BUILD)/tests/serve/test_tool_parse: tests/serve/test_tool_parse.c $(FUZZ_SERVE_REQUEST_SRC) \
		$(SERVE_HDR) $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Iexamples/llm-serve $(SERVE_CFLAGS) $< $(FUZZ_SERVE_REQUEST_SRC) -o $@ \
		-L$(BUILD) -lllminfer $(shell pkg-config --libs libcjson cmocka) -lm -pthread \
		-Wl,-rpath,'$$ORIGIN/../..' $(LDSAN)

$(FUZZ_SERVE_DIR)/fuzz_serve_embed: tests/serve/fuzz_serve_embed.c examples/llm-serve/embed_request.c \
		examples/llm-serve/embed_request.h $(FUZZ_SERVE_REQUEST_SRC) $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Iexamples/llm-serve $(SERVE_CFLAGS) -fsanitize=fuzzer $< \
		examples/llm-serve/embed_request.c $(FUZZ_SERVE_REQUEST_SRC) -pthread \
		-o $@ $(shell pkg-config --libs libcjson) -L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN/..' -lm

# --devices lists (device.c): the library only for the backend queries.
$(FUZZ_SERVE_DIR)/fuzz_serve_devices: tests/serve/fuzz_serve_devices.c examples/llm-serve/device.c \
		examples/llm-serve/device.h $(BUILD)/libllminfer.so
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Iexamples/llm-serve -fsanitize=fuzzer $< \
		examples/llm-serve/device.c -o $@ -L$(BUILD) -lllminfer -Wl,-rpath,'$$ORIGIN/..'

fuzz-serve: $(FUZZ_SERVE_DIR)/fuzz_serve_request $(FUZZ_SERVE_DIR)/fuzz_serve_embed \
		$(FUZZ_SERVE_DIR)/fuzz_serve_devices
	@mkdir -p $(FUZZ_SERVE_DIR)/corpus $(FUZZ_SERVE_DIR)/artifacts
	cp -n tests/serve/fuzz-seeds/* $(FUZZ_SERVE_DIR)/corpus/ 2>/dev/null || true
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$< -max_total_time=$(FUZZ_SERVE_SECONDS) -max_len=8192 -timeout=10 \
		-print_final_stats=1 -artifact_prefix=$(FUZZ_SERVE_DIR)/artifacts/ \
		$(FUZZ_SERVE_DIR)/corpus tests/serve/fuzz-seeds
	@mkdir -p $(FUZZ_SERVE_DIR)/corpus-embed
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(FUZZ_SERVE_DIR)/fuzz_serve_embed -max_total_time=$(FUZZ_SERVE_SECONDS) -max_len=8192 \
		-timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_SERVE_DIR)/artifacts/ \
		$(FUZZ_SERVE_DIR)/corpus-embed tests/serve/fuzz-seeds-embed

# Each seed and regression input once (CI).
fuzz-serve-regress: $(FUZZ_SERVE_DIR)/fuzz_serve_request $(FUZZ_SERVE_DIR)/fuzz_serve_embed \
		$(FUZZ_SERVE_DIR)/fuzz_serve_devices
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$< tests/serve/fuzz-seeds/*
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(FUZZ_SERVE_DIR)/fuzz_serve_embed tests/serve/fuzz-seeds-embed/*
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(FUZZ_SERVE_DIR)/fuzz_serve_devices tests/serve/fuzz-seeds-devices/*

# BENCH_SERVE_FLAGS: llm-serve's --device, --tp and --devices, e.g.
#   make bench-serve BENCH_SERVE_FLAGS="--device cuda --tp 2"
bench-serve: $(BUILD)/llm-serve $(MODEL)
	BUILD=$(BUILD) scripts/bench-serve.sh $(BENCH_SERVE_FLAGS)
