/* The device the model-running tests run on, so that one test binary
 * covers every backend. Two environment variables choose it:
 *   LLM_TEST_BACKEND=x   the registered backend named x ("cpu", "cuda"), or
 *                        "tp<N>": N CPU ranks of tensor parallelism (the
 *                        name the backend conformance suite gives them);
 *   LLM_TEST_TP=N        N ranks of tensor parallelism (CPU ranks, or N
 *                        devices of LLM_TEST_BACKEND).
 * Unset: the CPU backend, as llm_session_create gives.
 *
 * A test that runs a model is listed as device_test(f) and the group runs
 * through run_device_tests. Where the device cannot run here (a backend
 * that is not registered, or whose probe fails) those tests skip with the
 * reason before they start: a skip from inside a test would leave what it
 * holds allocated and an armed allocation-failure countdown behind for the
 * tests after it. Tests listed with cmocka_unit_test run as they are.
 *
 * Sessions and engines are made on the device by create_test_session and
 * create_test_engine. A model the device refuses with LLM_ERR_UNSUPPORTED
 * (one whose heads do not split in N ranks) can only be known there, so
 * that skips the test where it happens, with allocation failures disarmed
 * first. */
#ifndef TEST_DEVICE_UTIL_H
#define TEST_DEVICE_UTIL_H

#include "backend/tp/tp.h"
#include "engine/engine.h"
#include "session/session.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct test_device {
    bool resolved;
    bool set;      /* either variable given: sessions go through llm_session_create_ex */
    char bad[256]; /* a variable that does not parse: the device tests fail with this */
    char why[512]; /* the device cannot run here: the device tests skip with this */
    char backend[64];
    uint32_t tp; /* 0: not set */
} test_device;

/* "tp<N>", N in 1 .. LLMI_TP_MAX: N; else 0. */
static inline uint32_t test_device_tp_name(const char *name) {
    if (strncmp(name, "tp", 2) != 0 || name[2] < '1' || name[2] > '9' || name[3])
        return 0;
    uint32_t n = (uint32_t)(name[2] - '0');
    return n <= LLMI_TP_MAX ? n : 0;
}

static inline void test_device_resolve(test_device *d) {
    const char *tp = getenv("LLM_TEST_TP"), *name = getenv("LLM_TEST_BACKEND");
    if (tp && *tp) {
        char *end = NULL;
        unsigned long n = strtoul(tp, &end, 10);
        if (!end || *end || n == 0 || n > 64) {
            snprintf(d->bad, sizeof d->bad, "LLM_TEST_TP='%s': a rank count is wanted", tp);
            return;
        }
        d->tp = (uint32_t)n;
        d->set = true;
    }
    if (!name || !*name)
        return;
    d->set = true;
    uint32_t ranks = test_device_tp_name(name);
    if (ranks) {
        if (d->tp && d->tp != ranks) {
            snprintf(d->bad, sizeof d->bad, "LLM_TEST_BACKEND=%s and LLM_TEST_TP=%u disagree", name,
                     d->tp);
            return;
        }
        d->tp = ranks;
        snprintf(d->backend, sizeof d->backend, "cpu");
        return;
    }
    if (strlen(name) >= sizeof d->backend) {
        snprintf(d->bad, sizeof d->bad, "LLM_TEST_BACKEND='%.64s...': too long for a name", name);
        return;
    }
    snprintf(d->backend, sizeof d->backend, "%s", name);
    for (size_t i = 0; i < llm_backend_count(); i++) {
        llm_backend_info info = {sizeof info};
        if (llm_backend_get_info(i, &info) != LLM_OK || strcmp(info.name, name) != 0)
            continue;
        if (!info.available)
            snprintf(d->why, sizeof d->why, "backend '%s' (LLM_TEST_BACKEND) cannot run here: %s",
                     name, info.reason);
        return;
    }
    snprintf(d->why, sizeof d->why, "backend '%s' (LLM_TEST_BACKEND) is not registered", name);
}

/* The device of this process, resolved on first use. */
static inline const test_device *test_device_get(void) {
    static test_device d;
    if (!d.resolved) {
        test_device_resolve(&d);
        d.resolved = true;
    }
    return &d;
}

/* The device params of LLM_TEST_TP / LLM_TEST_BACKEND; false when neither
 * is set. Fails the calling test when the device cannot run here: only
 * device tests ask, and run_device_tests skips those before they start. */
static inline bool device_params_from_env(llm_device_params *dp) {
    const test_device *d = test_device_get();
    if (d->bad[0])
        fail_msg("%s", d->bad);
    if (!d->set)
        return false;
    if (d->why[0])
        fail_msg("a test not listed with device_test() runs a model on the test device, "
                 "which cannot run here: %s",
                 d->why);
    llm_device_params_init(dp);
    if (d->backend[0])
        dp->backend = d->backend;
    if (d->tp)
        dp->tensor_parallel = d->tp;
    return true;
}

/* The test device refused the test's model (LLM_ERR_UNSUPPORTED, the
 * message in llm_last_error): frees `own` (a model the test loaded for
 * itself; NULL for none), disarms allocation failures (a countdown left
 * armed would fail the next test's first allocation) and skips. */
static inline void skip_refused_model(llm_model *own) {
    printf("# skipped: %s\n", llm_last_error());
    llm_model_free(own);
    llmi_alloc_fail_after(0);
    skip();
}

/* llm_session_create on the device of LLM_TEST_TP / LLM_TEST_BACKEND. A
 * test that holds a model of its own checks for LLM_ERR_UNSUPPORTED and
 * calls skip_refused_model with it. */
static inline llm_status try_test_session(const llm_model *m, const llm_session_params *p,
                                          llm_session **out) {
    llm_device_params dp;
    if (!device_params_from_env(&dp))
        return llm_session_create(m, p, out);
    return llm_session_create_ex(m, p, &dp, out);
}

/* try_test_session, skipping the test when the device refuses the model. */
static inline llm_status create_test_session(const llm_model *m, const llm_session_params *p,
                                             llm_session **out) {
    llm_status st = try_test_session(m, p, out);
    if (st == LLM_ERR_UNSUPPORTED)
        skip_refused_model(NULL);
    return st;
}

/* llmi_engine_create with cfg's backend and device replaced by those of
 * LLM_TEST_TP / LLM_TEST_BACKEND (cfg as it is when neither is set). The
 * engine opens its own instance: cfg must not name one to share. */
static inline llm_status create_test_engine(const llmi_engine_config *cfg, llmi_engine **out) {
    llmi_engine_config c = *cfg;
    llm_device_params dp;
    if (device_params_from_env(&dp)) {
        assert_null(cfg->backend);
        llmi_session_device dev;
        if (llmi_session_device_resolve(&dp, &dev) != LLM_OK)
            fail_msg("test device: %s", llmi_error_message());
        c.ops = dev.ops;
        c.backend_cfg.device = dev.device;
    }
    llm_status st = llmi_engine_create(&c, out);
    if (st == LLM_ERR_UNSUPPORTED)
        skip_refused_model(NULL);
    return st;
}

/* ---- the test list ---- */

static int test_device_tag; /* its address marks a device test */

#define device_test(f) cmocka_unit_test_prestate(f, &test_device_tag)

static inline void test_device_skip(void **state) {
    (void)state;
    printf("# skipped: %s\n", test_device_get()->why);
    skip();
}

static inline void test_device_fail(void **state) {
    (void)state;
    fail_msg("%s", test_device_get()->bad);
}

/* cmocka_run_group_tests for a list with device tests: those skip (or fail,
 * on a variable that does not parse) without running where the device
 * cannot run. LLM_TEST_FILTER, when set, is cmocka's test filter. */
#define run_device_tests(tests, setup, teardown)                                                   \
    run_device_tests_(#tests, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

static inline int run_device_tests_(const char *name, struct CMUnitTest *tests, size_t n,
                                    CMFixtureFunction setup, CMFixtureFunction teardown) {
    const test_device *d = test_device_get();
    for (size_t i = 0; i < n; i++) {
        if (tests[i].initial_state != &test_device_tag)
            continue;
        tests[i].initial_state = NULL;
        if (d->bad[0])
            tests[i].test_func = test_device_fail;
        else if (d->why[0])
            tests[i].test_func = test_device_skip;
    }
    if (getenv("LLM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("LLM_TEST_FILTER"));
    return _cmocka_run_group_tests(name, tests, n, setup, teardown);
}

#endif
