/* Storage of the mask cache: a grammar's entries, found by their key (the
 * top positions of every stack, see grammar.h). Entries are never removed
 * while the grammar lives, so a found entry stays valid without the lock;
 * once LLMI_GCACHE_MAX_ENTRIES are stored, new keys are computed each time
 * and not kept. */
#include "grammar/grammar.h"

#include <pthread.h>

struct llmi_gcache {
    pthread_mutex_t lock;
    llmi_gcache_entry *entries;
    uint32_t n, cap;
};

llm_status llmi_gcache_create(llmi_gcache **out) {
    *out = NULL;
    llmi_gcache *c = llmi_calloc(1, sizeof *c);
    if (!c)
        return llmi_oom("grammar mask cache");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        llmi_free(c);
        return llmi_error(LLM_ERR_INTERNAL, "grammar mask cache: mutex");
    }
    *out = c;
    return LLM_OK;
}

void llmi_gcache_entry_free(llmi_gcache_entry *e) {
    llmi_free(e->key);
    llmi_free(e->accepted);
    llmi_free(e->uncertain);
    memset(e, 0, sizeof *e);
}

void llmi_gcache_free(llmi_gcache *c) {
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n; i++)
        llmi_gcache_entry_free(&c->entries[i]);
    llmi_free(c->entries);
    pthread_mutex_destroy(&c->lock);
    llmi_free(c);
}

static const llmi_gcache_entry *find_locked(llmi_gcache *c, const uint32_t *key, uint32_t n,
                                            uint64_t hash) {
    for (uint32_t i = 0; i < c->n; i++) {
        const llmi_gcache_entry *e = &c->entries[i];
        if (e->hash == hash && e->n_key == n && memcmp(e->key, key, n * sizeof *key) == 0)
            return e;
    }
    return NULL;
}

const llmi_gcache_entry *llmi_gcache_find(llmi_gcache *c, const uint32_t *key, uint32_t n,
                                          uint64_t hash) {
    pthread_mutex_lock(&c->lock);
    const llmi_gcache_entry *e = find_locked(c, key, n, hash);
    pthread_mutex_unlock(&c->lock);
    return e;
}

llm_status llmi_gcache_insert(llmi_gcache *c, llmi_gcache_entry *e, const llmi_gcache_entry **out,
                              bool *owned) {
    *out = e;
    *owned = false;
    pthread_mutex_lock(&c->lock);
    const llmi_gcache_entry *have = find_locked(c, e->key, e->n_key, e->hash);
    if (have) { /* another thread stored it first */
        pthread_mutex_unlock(&c->lock);
        llmi_gcache_entry_free(e);
        *out = have;
        *owned = true;
        return LLM_OK;
    }
    if (c->n == LLMI_GCACHE_MAX_ENTRIES) {
        pthread_mutex_unlock(&c->lock);
        return LLM_OK;
    }
    /* The entries array never moves once it exists: found entries are used
     * without the lock. */
    if (!c->entries) {
        c->entries = llmi_calloc(LLMI_GCACHE_MAX_ENTRIES, sizeof *c->entries);
        if (!c->entries) {
            pthread_mutex_unlock(&c->lock);
            return LLM_OK; /* not kept; the caller still has its entry */
        }
        c->cap = LLMI_GCACHE_MAX_ENTRIES;
    }
    c->entries[c->n] = *e;
    *out = &c->entries[c->n++];
    *owned = true;
    memset(e, 0, sizeof *e);
    pthread_mutex_unlock(&c->lock);
    return LLM_OK;
}
