/* Server counters and histograms, rendered with the session's stats as
 * Prometheus text. */
#ifndef LLM_SERVE_METRICS_H
#define LLM_SERVE_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "llm.h"
#include "structured.h"

typedef struct metrics metrics;

metrics *metrics_create(void);
void metrics_free(metrics *m);

/* One finished HTTP request on `endpoint` with `status`. */
void metrics_count_request(metrics *m, const char *endpoint, int status);
void metrics_observe_generation(metrics *m, uint32_t prompt_tokens, uint32_t generated_tokens,
                                double ttft_seconds, double tpot_seconds);
void metrics_adjust_active(metrics *m, int delta);
int metrics_active(metrics *m);

/* The count of open connections to report (kept by the HTTP layer). */
void metrics_watch_connections(metrics *m, const atomic_int *open_connections);
/* One connection refused at the global cap. */
void metrics_count_refused_connection(metrics *m);

/* Prometheus exposition text; caller frees. NULL when out of memory.
 * `grammars` may be NULL (no structured-output metrics). */
char *metrics_render(metrics *m, llm_session *session, const char *device, uint32_t tensor_parallel,
                     const grammar_cache_stats *grammars);

#endif
