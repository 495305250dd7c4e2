/* Storage of the position masks (see grammar.h): the chains' entries,
 * found by their key through open addressing. Built once by posmask.c,
 * then read-only. Kept apart from the builder so that freeing a grammar
 * (compile.c) and making a mask (mask.c) need nothing of the walk. */
#include "grammar/grammar.h"

/* Accepted-token bitsets, each stored once: most chains inside strings,
 * or in the same place of different rules, accept the same tokens. */
typedef struct shared_bits {
    uint32_t *bits;
    uint64_t hash;
} shared_bits;

struct llmi_gpostable {
    llmi_gposmask *m;
    uint32_t n, cap;
    int32_t *slots; /* open addressing by key hash */
    uint32_t n_slots;
    uint32_t depth;
    shared_bits *pool;
    uint32_t n_pool, cap_pool;
    size_t words;
};

static uint64_t key_hash(const uint32_t *key) {
    uint64_t h = 0x84222325cbf29ce4ull;
    for (uint32_t i = 0; i < LLMI_GPOS_KEY; i++) {
        h = (h ^ key[i]) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    return h;
}

void llmi_gpostable_free(llmi_gpostable *t) {
    if (!t)
        return;
    for (uint32_t i = 0; i < t->n; i++) {
        llmi_free(t->m[i].list);
        llmi_free(t->m[i].uncertain);
    }
    for (uint32_t i = 0; i < t->n_pool; i++)
        llmi_free(t->pool[i].bits);
    llmi_free(t->pool);
    llmi_free(t->m);
    llmi_free(t->slots);
    llmi_free(t);
}

uint32_t llmi_gpostable_depth(const llmi_gpostable *t) { return t->depth; }

uint32_t llmi_gpostable_size(const llmi_gpostable *t) { return t->n; }

size_t llmi_gpostable_bytes(const llmi_gpostable *t) {
    size_t n = sizeof *t + (size_t)t->cap * sizeof *t->m + (size_t)t->n_slots * sizeof *t->slots +
               (size_t)t->cap_pool * sizeof *t->pool + t->n_pool * t->words * sizeof(uint32_t);
    for (uint32_t i = 0; i < t->n; i++)
        n += (size_t)t->m[i].n_list * sizeof(llm_token) +
             (size_t)t->m[i].n_uncertain * sizeof(uint32_t);
    return n;
}

llm_status llmi_gpostable_bits(llmi_gpostable *t, const uint32_t *bits, size_t words,
                               const uint32_t **out) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < words; i++)
        h = (h ^ bits[i]) * 0x100000001b3ull;
    for (uint32_t i = 0; i < t->n_pool; i++)
        if (t->pool[i].hash == h && !memcmp(t->pool[i].bits, bits, words * sizeof *bits)) {
            *out = t->pool[i].bits;
            return LLM_OK;
        }
    if (t->n_pool == t->cap_pool) {
        uint32_t c = t->cap_pool ? 2 * t->cap_pool : 16;
        shared_bits *q = llmi_realloc(t->pool, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar position masks");
        t->pool = q;
        t->cap_pool = c;
    }
    uint32_t *copy = llmi_malloc(words * sizeof *copy);
    if (!copy)
        return llmi_oom("grammar position masks");
    memcpy(copy, bits, words * sizeof *copy);
    t->pool[t->n_pool++] = (shared_bits){copy, h};
    t->words = words;
    *out = copy;
    return LLM_OK;
}

const llmi_gposmask *llmi_gpostable_find(const llmi_gpostable *t, const uint32_t *key) {
    if (!t->n_slots)
        return NULL;
    for (uint32_t k = (uint32_t)key_hash(key) & (t->n_slots - 1); t->slots[k] >= 0;
         k = (k + 1) & (t->n_slots - 1))
        if (!memcmp(t->m[t->slots[k]].key, key, sizeof t->m[0].key))
            return &t->m[t->slots[k]];
    return NULL;
}

static llm_status rehash(llmi_gpostable *t) {
    uint32_t n = t->n_slots ? 2 * t->n_slots : 64;
    int32_t *slots = llmi_malloc((size_t)n * sizeof *slots);
    if (!slots)
        return llmi_oom("grammar position masks");
    memset(slots, 0xFF, (size_t)n * sizeof *slots);
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t k = (uint32_t)key_hash(t->m[i].key) & (n - 1);
        while (slots[k] >= 0)
            k = (k + 1) & (n - 1);
        slots[k] = (int32_t)i;
    }
    llmi_free(t->slots);
    t->slots = slots;
    t->n_slots = n;
    return LLM_OK;
}

llm_status llmi_gpostable_create(uint32_t depth, llmi_gpostable **out) {
    *out = llmi_calloc(1, sizeof **out);
    if (!*out)
        return llmi_oom("grammar position masks");
    (*out)->depth = depth;
    return LLM_OK;
}

llm_status llmi_gpostable_insert(llmi_gpostable *t, const uint32_t *key, uint32_t max,
                                 llmi_gposmask **out) {
    *out = NULL;
    if (llmi_gpostable_find(t, key))
        return LLM_OK;
    if (t->n >= max)
        return llmi_error(LLM_ERR_LIMIT, "grammar: more than %u chains of stack tops", max);
    if (t->n == t->cap) {
        uint32_t c = t->cap ? 2 * t->cap : 64;
        llmi_gposmask *q = llmi_realloc(t->m, (size_t)c * sizeof *q);
        if (!q)
            return llmi_oom("grammar position masks");
        t->m = q;
        t->cap = c;
    }
    if (2 * (t->n + 1) > t->n_slots)
        LLMI_TRY(rehash(t));
    llmi_gposmask *m = &t->m[t->n];
    memset(m, 0, sizeof *m);
    memcpy(m->key, key, sizeof m->key);
    uint32_t k = (uint32_t)key_hash(key) & (t->n_slots - 1);
    while (t->slots[k] >= 0)
        k = (k + 1) & (t->n_slots - 1);
    t->slots[k] = (int32_t)t->n++;
    *out = m;
    return LLM_OK;
}
