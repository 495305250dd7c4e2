/* The kernels' weight-type traits table against core's type table: the
 * model loader accepts exactly core's weight types (llmi_ttype_info.weight)
 * and the kernels must multiply exactly those, or a model would load and
 * then fail (or a supported type be refused). Also: every entry's kernels
 * are present at every level built, and activation types describe their
 * row layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/kernels_impl.h"
#include "core/ttype.h"

/* Past the largest llmi_ttype, with room for new GGUF types. */
#define TYPES_CHECKED 64

static void test_weight_types_agree(void **state) {
    (void)state;
    int n_weight = 0;
    for (uint32_t t = 0; t < TYPES_CHECKED; t++) {
        const llmi_ttype_info *ti = llmi_ttype_get(t);
        const int weight = ti && ti->weight;
        assert_int_equal(llmi_kernels_type_supported(t), weight);
        n_weight += weight;
    }
    assert_int_equal(n_weight, 10); /* F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q6_K */
}

static void test_entries_complete(void **state) {
    (void)state;
#if defined(LLMI_KERNELS_X86)
    const int levels = LLMI_KLEVEL_COUNT;
#else
    const int levels = 1;
#endif
    for (uint32_t t = 0; t < TYPES_CHECKED; t++) {
        if (!llmi_kernels_type_supported(t))
            continue;
        const llmi_ktraits *tr = llmi_ktraits_get(t);
        assert_non_null(tr);
        for (int l = 0; l < levels; l++) {
            assert_non_null(tr->f32[l]);
            assert_non_null(tr->f32[l]->fn);
            assert_true(tr->f32[l]->tile >= 1);
            if (tr->act_type == LLMI_T_F32) {
                assert_null(tr->q[l]);
                continue;
            }
            assert_non_null(tr->q[l]);
            assert_non_null(tr->q[l]->fn);
            assert_true(tr->q[l]->tile >= 1);
            const llmi_ktraits *at = llmi_ktraits_get(tr->act_type);
            assert_non_null(at);
            assert_true(at->act_block_bytes > 0);
            assert_non_null(at->quant[l]);
            /* The activation blocks tile the weight blocks. */
            assert_int_equal(llmi_ttype_get(t)->block % llmi_ttype_get(tr->act_type)->block, 0);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_types_agree),
        cmocka_unit_test(test_entries_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
