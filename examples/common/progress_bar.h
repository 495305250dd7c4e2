/* The load progress of the command-line tools (llm.h's llm_progress_fn):
 * a bar redrawn in place on a terminal, one plain line per finished phase
 * otherwise (a log file), nothing when quiet. Header-only: each tool is
 * built from its own sources and llm.h. */
#ifndef LLM_EXAMPLES_PROGRESS_BAR_H
#define LLM_EXAMPLES_PROGRESS_BAR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include <llm.h>

typedef struct progress_bar {
    const char *tool; /* "llm-run": the prefix of each line */
    FILE *out;        /* stderr */
    bool terminal;    /* draw in place */
    int last_percent; /* of the phase being drawn; -1 before its first call */
    int phase;        /* being drawn; -1 for none */
} progress_bar;

static inline void progress_bar_init(progress_bar *b, const char *tool, FILE *out) {
    *b = (progress_bar){tool, out, isatty(fileno(out)) == 1, -1, -1};
}

/* Bytes as "12.3 MB", other units as they are ("1/2"). */
static inline void progress_bar_amount(char *buf, size_t cap, llm_progress_phase phase,
                                       uint64_t n) {
    if (phase == LLM_PROGRESS_WARMUP)
        snprintf(buf, cap, "%llu", (unsigned long long)n);
    else
        snprintf(buf, cap, "%.1f MB", (double)n / 1e6);
}

/* An llm_progress_fn; `user` is the progress_bar. Never cancels. */
static inline bool progress_bar_update(llm_progress_phase phase, uint64_t done, uint64_t total,
                                       void *user) {
    progress_bar *b = user;
    int percent = total ? (int)(done * 100 / total) : 100;
    bool finished = done >= total;
    if ((int)phase != b->phase) {
        b->phase = (int)phase;
        b->last_percent = -1;
    }
    char d[32], t[32];
    progress_bar_amount(d, sizeof d, phase, done);
    progress_bar_amount(t, sizeof t, phase, total);
    if (b->terminal) {
        if (percent == b->last_percent && !finished)
            return true;
        enum { WIDTH = 30 };
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < percent * WIDTH / 100 ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(b->out, "\r%s: %-7s [%s] %3d%% %s / %s\033[K%s", b->tool,
                llm_progress_phase_name(phase), bar, percent, d, t, finished ? "\n" : "");
        fflush(b->out);
    } else if (finished && percent != b->last_percent) {
        fprintf(b->out, "%s: %s %s done\n", b->tool, llm_progress_phase_name(phase), t);
    }
    b->last_percent = percent;
    return true;
}

#endif
