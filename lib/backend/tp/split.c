/* How a model splits across tensor-parallel ranks: which sizes work, and
 * which KV heads each rank holds. Shared by the weight shards (shard.c) and
 * the tp backend (tp.c), which both sit above it. */
#include "backend/tp/split.h"

#include <stdio.h>

void llmi_tp_split_heads(uint32_t n_head_kv, uint32_t n_ranks, uint32_t rank, uint32_t *kv0,
                         uint32_t *n_kv) {
    if (n_head_kv % n_ranks == 0) {
        *n_kv = n_head_kv / n_ranks;
        *kv0 = rank * *n_kv;
    } else {
        *n_kv = 1;
        *kv0 = rank * n_head_kv / n_ranks;
    }
}

uint32_t llmi_tp_kv_owner(uint32_t n_head_kv, uint32_t n_ranks, uint32_t head) {
    if (n_head_kv % n_ranks == 0)
        return head / (n_head_kv / n_ranks);
    return head * (n_ranks / n_head_kv);
}

/* Why m does not split across n ranks (into why), or true when it does. */
static bool splits(const llm_model *m, uint32_t n, char *why, size_t cap) {
    const llmi_hparams *hp = &m->hp;
    if (hp->features.encoder) {
        /* the tp plan shards decoder weights only; its post-norm encoder
         * layers (biases, LayerNorms) are not split */
        snprintf(why, cap, "tensor parallelism does not run encoder models (%s)", hp->arch);
        return false;
    }
    if (n == 1)
        return true;
    if (hp->n_head % n) {
        snprintf(why, cap, "%u attention heads do not split in %u", hp->n_head, n);
        return false;
    }
    if (hp->n_head_kv % n && n % hp->n_head_kv) {
        snprintf(why, cap, "%u KV heads neither split in %u nor replicate to %u", hp->n_head_kv, n,
                 n);
        return false;
    }
    return true;
}

llm_status llmi_tp_check(const llm_model *m, uint32_t n_ranks) {
    if (n_ranks == 0 || n_ranks > LLMI_TP_MAX)
        return llmi_error(LLM_ERR_UNSUPPORTED, "tensor_parallel %u: sizes 1 to %u are supported",
                          n_ranks, LLMI_TP_MAX);
    char why[256];
    if (splits(m, n_ranks, why, sizeof why))
        return LLM_OK;
    char ok[64] = "";
    size_t len = 0;
    char scratch[256];
    for (uint32_t n = 1; n <= LLMI_TP_MAX; n++)
        if (splits(m, n, scratch, sizeof scratch) && len + 8 < sizeof ok)
            len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%u", len ? ", " : "", n);
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "model '%s' cannot run at tensor_parallel %u: %s (sizes that work: %s)",
                      m->name, n_ranks, why, ok);
}
