/* llm-bench --spec: speculative decoding at batch 1. Every request runs
 * alone, once without and once with speculation (alternating which goes
 * first, in two sessions so neither reuses the other's prefix cache), and
 * the tool reports the speedup, the drafts' acceptance rate and how many
 * drafts a step accepts on average, and checks that greedy outputs match. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Prompts that ask to repeat or edit a text they carry: what prompt-lookup
 * decoding is for. */
static const char *const repetitive_prompts[] = {
    "Repeat the following text exactly: The lighthouse keeper climbed the narrow stairs every "
    "evening at dusk, counting the steps as his father had taught him. At the top he wiped the "
    "salt from the great lens, trimmed the wick and lit the lamp, and then he sat by the window "
    "with a mug of tea to watch the fishing boats find their way home. Some nights the fog "
    "rolled in so thick that he could not see the water at all, and on those nights he wound "
    "the old brass horn and sounded it every half minute until dawn. In the morning he wrote in "
    "the logbook how many boats had passed, what the weather had been, and whether the lamp had "
    "burned steadily. He had kept the book for thirty years, and his father had kept it for "
    "forty before him, and the first pages were so faded that the ink had turned the colour of "
    "weak coffee.",
    "Repeat the following code exactly, with the function renamed to total:\n\n"
    "/* Adds up the positive entries of values. */\n"
    "int sum_positive(const int *values, int count) {\n    int sum = 0;\n"
    "    if (values == NULL || count <= 0)\n        return 0;\n"
    "    for (int i = 0; i < count; i++) {\n        if (values[i] > 0)\n"
    "            sum += values[i];\n    }\n    return sum;\n}\n\n"
    "int main(void) {\n    int data[5] = {3, -1, 4, -1, 5};\n"
    "    printf(\"%d\\n\", sum_positive(data, 5));\n    return 0;\n}\n",
    "Repeat the following text exactly: To bake a simple loaf, mix five hundred grams of flour "
    "with a teaspoon of salt and a sachet of dried yeast in a large bowl. Add three hundred "
    "millilitres of warm water and a spoonful of olive oil, and stir until the dough comes "
    "together. Turn it out onto a floured table and knead it for ten minutes, until it is "
    "smooth and springs back when you press it. Put it back in the bowl, cover it with a damp "
    "cloth and leave it somewhere warm for an hour, until it has doubled in size. Knock the air "
    "out of it, shape it into a loaf, put it in a greased tin and let it rise again for half an "
    "hour. Bake it in a hot oven for thirty minutes, until the crust is golden and the loaf "
    "sounds hollow when you tap it underneath.",
    "Copy this shopping list, but write pears instead of apples:\n- two litres of milk\n"
    "- a dozen eggs\n- six apples\n- a loaf of brown bread\n- a bag of rice\n"
    "- tomatoes, onions and garlic\n- a bar of dark chocolate\n- a jar of honey\n"
    "- washing-up liquid\n- a packet of spaghetti\n- two tins of chopped tomatoes\n"
    "- a block of cheddar cheese\n- bananas\n- coffee beans\n- a bottle of orange juice\n",
    "Repeat the following text exactly: The night train left the station a few minutes after "
    "ten. Most of the passengers were asleep before it reached the river, but a small girl in "
    "the last carriage kept her face pressed to the glass, watching the lights of the villages "
    "slide past like beads on a string. Her grandmother had given her a window seat and a paper "
    "bag of sweets, and had told her that when she woke up they would be by the sea. The girl "
    "did not mean to sleep at all. She counted the bridges, and the level crossings with their "
    "red lamps, and the cows standing pale in the dark fields, until the rocking of the train "
    "and the warm air from the heater made her eyes close in spite of her. When she opened them "
    "again the sky was grey and pink, and there, beyond the dunes, was the sea.",
    "Repeat the following code exactly, with the parameter items renamed to values:\n\n"
    "def summarize(items):\n"
    "    \"\"\"Returns the count, mean, smallest and largest of items.\"\"\"\n"
    "    if not items:\n        return 0, 0.0, None, None\n    total = 0.0\n"
    "    smallest = items[0]\n    largest = items[0]\n    for item in items:\n"
    "        total += item\n        if item < smallest:\n            smallest = item\n"
    "        if item > largest:\n            largest = item\n"
    "    return len(items), total / len(items), smallest, largest\n",
    "Repeat the following text exactly: Water evaporates from the oceans, lakes and rivers when "
    "the sun warms their surface, and it rises into the air as an invisible vapour. As the air "
    "climbs higher it cools, and the vapour condenses into tiny droplets around specks of dust, "
    "forming clouds. The droplets collide and grow, and when they become too heavy for the air "
    "to hold they fall as rain, or as snow and hail when it is cold enough. Some of the water "
    "runs off the land into streams and rivers, some soaks into the ground and flows slowly "
    "through the rocks, and some is taken up by plants and breathed out again through their "
    "leaves. Sooner or later nearly all of it finds its way back to the sea, where the cycle "
    "begins again.",
    "Repeat this email exactly: Dear Ms Patel, thank you for your letter of the fourth, and for "
    "the detailed notes on the new warehouse layout. I am happy to confirm that the planning "
    "meeting will take place on Thursday at two o'clock in the main conference room on the "
    "third floor. Mr Okafor from the logistics team and Ms Lindqvist from finance will join "
    "us, and I have asked the facilities office to set up the projector so that you can show "
    "your drawings. If you would like to send the slides in advance, I will make sure that "
    "everyone has a copy before the meeting. Please let me know if you need anything else "
    "before then, or if the time is no longer convenient for you. Kind regards, Daniel Moreau, "
    "Operations Manager.",
};

/* Prompts that leave the model to itself. */
static const char *const free_prompts[] = {
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue.",
    "Give me three tips for learning a new language.",
    "Describe a day at the beach.",
    "What are the benefits of regular exercise?",
    "Write a poem about autumn leaves.",
    "How does a computer store information?",
    "Tell me about the history of bicycles.",
};

const char *bench_workload_name(bench_workload_kind w) {
    return w == WORKLOAD_REPETITIVE ? "repetitive" : w == WORKLOAD_FREE ? "free" : "random";
}

static const char *spec_name(uint32_t mode) {
    return mode == LLM_SPEC_NGRAM ? "ngram" : mode == LLM_SPEC_DRAFT ? "draft" : "none";
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The model's chat template around `text` (the text itself without one),
 * tokenized. Caller frees *out. */
static llm_status chat_tokens(const llm_model *m, const char *text, llm_token **out, size_t *n) {
    *out = NULL;
    llm_chat_message msg = {"user", text};
    size_t len = 0;
    char *templated = NULL;
    llm_status st = llm_chat_template_apply(m, &msg, 1, true, NULL, 0, &len);
    if (st == LLM_OK || st == LLM_ERR_BUFFER_TOO_SMALL) {
        templated = malloc(len + 1);
        if (!templated) return LLM_ERR_OUT_OF_MEMORY;
        st = llm_chat_template_apply(m, &msg, 1, true, templated, len + 1, &len);
        if (st != LLM_OK) {
            free(templated);
            return st;
        }
        text = templated;
    }
    uint32_t flags = LLM_TOKENIZE_ADD_SPECIAL | LLM_TOKENIZE_PARSE_SPECIAL;
    size_t need = 0;
    st = llm_tokenize(m, text, strlen(text), flags, NULL, 0, &need);
    if (st == LLM_OK || st == LLM_ERR_BUFFER_TOO_SMALL) {
        *out = malloc((need ? need : 1) * sizeof **out);
        st = *out ? llm_tokenize(m, text, strlen(text), flags, *out, need, n)
                  : LLM_ERR_OUT_OF_MEMORY;
    }
    free(templated);
    return st;
}

/* One request's run. */
typedef struct one_run {
    double wall_s;   /* submit -> finish event */
    double decode_s; /* first token -> finish event */
    uint32_t n_tokens;
    llm_token *toks;
    uint64_t spec_steps, drafted, accepted; /* this request's share of the stats */
} one_run;

/* Submits one request, steps until it finishes. */
static int run_one(llm_session *s, const llm_token *prompt, size_t n, uint32_t max_new,
                   bool ignore_eos, const llm_sampling_params *sp, uint32_t mode, uint32_t k,
                   one_run *r) {
    llm_session_stats before = {sizeof before}, after = {sizeof after};
    llm_status st = llm_session_get_stats(s, &before);
    if (st != LLM_OK) return bench_fail("reading the session stats", st);
    llm_request_params rp;
    llm_request_params_init(&rp);
    rp.max_new_tokens = max_new;
    rp.ignore_eos = ignore_eos;
    rp.sampling = sp;
    rp.spec_mode = mode;
    rp.spec_k = k;
    r->toks = malloc((max_new ? max_new : 1) * sizeof *r->toks);
    if (!r->toks) {
        fprintf(stderr, "llm-bench: out of memory\n");
        return 2;
    }
    r->n_tokens = 0;
    llm_event ev[64];
    llm_request_id id;
    double t0 = now_s(), t_first = 0;
    if ((st = llm_session_submit(s, prompt, n, &rp, &id)) != LLM_OK)
        return bench_fail("submitting a request", st);
    for (bool done = false; !done;) {
        size_t n_ev = 0;
        if ((st = llm_session_step(s, ev, 64, sizeof ev[0], &n_ev)) != LLM_OK)
            return bench_fail("stepping the session", st);
        double t = now_s();
        for (size_t e = 0; e < n_ev; e++) {
            if (ev[e].token != LLM_TOKEN_NONE && r->n_tokens < max_new) {
                if (r->n_tokens == 0) t_first = t;
                r->toks[r->n_tokens++] = ev[e].token;
            }
            if (ev[e].finish_reason == LLM_FINISH_ERROR) {
                fprintf(stderr, "llm-bench: request failed: %s\n", llm_status_name(ev[e].status));
                return 2;
            }
            if (ev[e].finish_reason != LLM_FINISH_NONE) {
                done = true;
                r->wall_s = t - t0;
                r->decode_s = r->n_tokens ? t - t_first : 0;
            }
        }
    }
    if ((st = llm_session_get_stats(s, &after)) != LLM_OK)
        return bench_fail("reading the session stats", st);
    r->spec_steps = after.spec_steps - before.spec_steps;
    r->drafted = after.spec_draft_tokens - before.spec_draft_tokens;
    r->accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    return 0;
}

typedef struct totals {
    double wall_s, decode_s;
    uint64_t tokens, decode_tokens;
} totals;

static void add_run(totals *t, const one_run *r) {
    t->wall_s += r->wall_s;
    t->decode_s += r->decode_s;
    t->tokens += r->n_tokens;
    t->decode_tokens += r->n_tokens ? r->n_tokens - 1 : 0;
}

static double ratio(double a, double b) { return b > 0 && isfinite(a) ? a / b : NAN; }

static llm_session *new_session(const llm_model *m, const llm_model *draft, const bench_opts *o,
                                llm_status *st) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = (uint32_t)o->threads;
    sp.kv_cache_bytes = o->kv_cache_mb ? (uint64_t)o->kv_cache_mb << 20 : 256ull << 20;
    sp.kv_block_size = (uint32_t)o->block_size;
    if (o->max_batch_tokens > 0) sp.max_batch_tokens = (uint32_t)o->max_batch_tokens;
    sp.prefix_cache = o->prefix_cache;
    sp.draft_model = draft;
    llm_session *s = NULL;
    *st = bench_session_create(m, &sp, o, &s);
    return s;
}

static void json_totals(FILE *f, const char *key, const totals *t) {
    fprintf(f, "  \"%s\": {\"wall_s\": ", key);
    bench_json_num(f, t->wall_s);
    fprintf(f, ", \"tokens\": %llu, \"tok_s\": ", (unsigned long long)t->tokens);
    bench_json_num(f, ratio((double)t->tokens, t->wall_s));
    fputs(", \"decode_s\": ", f);
    bench_json_num(f, t->decode_s);
    fputs(", \"decode_tok_s\": ", f);
    bench_json_num(f, ratio((double)t->decode_tokens, t->decode_s));
    fputs("},\n", f);
}

int bench_spec(const llm_model *model, const bench_opts *o) {
    int rc = 0;
    llm_status st;
    llm_model *draft = NULL;
    if (o->draft_model && (st = llm_model_load(o->draft_model, NULL, &draft)) != LLM_OK)
        return bench_fail("loading the draft model", st);
    /* The prompts. */
    size_t n = o->requests_set ? (size_t)o->requests : 8;
    llm_token **prompts = calloc(n, sizeof *prompts);
    size_t *n_prompt = calloc(n, sizeof *n_prompt);
    uint32_t *max_new = calloc(n, sizeof *max_new);
    one_run *base = calloc(n, sizeof *base), *spec = calloc(n, sizeof *spec);
    llm_session *s_base = NULL, *s_spec = NULL;
    bench_workload w = {0};
    if (!prompts || !n_prompt || !max_new || !base || !spec) {
        fprintf(stderr, "llm-bench: out of memory\n");
        rc = 2;
        goto out;
    }
    bool text = o->workload != WORKLOAD_RANDOM;
    long out_hi = o->output_len_set ? o->output_len.hi : 256;
    if (text) {
        const char *const *set = o->workload == WORKLOAD_REPETITIVE ? repetitive_prompts
                                                                     : free_prompts;
        size_t n_set = o->workload == WORKLOAD_REPETITIVE
                           ? sizeof repetitive_prompts / sizeof *repetitive_prompts
                           : sizeof free_prompts / sizeof *free_prompts;
        for (size_t i = 0; i < n; i++) {
            if ((st = chat_tokens(model, set[i % n_set], &prompts[i], &n_prompt[i])) != LLM_OK) {
                rc = bench_fail("tokenizing a prompt", st);
                goto out;
            }
            max_new[i] = (uint32_t)out_hi; /* up to: the model may end earlier */
        }
    } else {
        bench_opts wo = *o;
        wo.requests = (long)n;
        wo.prefix_len = 0;
        wo.arrival_rate = 0;
        if ((rc = bench_workload_make(model, &wo, &w)) != 0) goto out;
        for (size_t i = 0; i < n; i++) {
            prompts[i] = w.req[i].prompt;
            w.req[i].prompt = NULL;
            n_prompt[i] = w.req[i].n_prompt;
            max_new[i] = w.req[i].n_output; /* exactly: ignore_eos */
        }
    }
    if (o->warmup && (rc = bench_warmup(model, o)) != 0) goto out;
    if (!(s_base = new_session(model, NULL, o, &st)) ||
        !(s_spec = new_session(model, draft, o, &st))) {
        rc = bench_fail("creating a session", st);
        goto out;
    }
    llm_sampling_params sampling;
    llm_sampling_params_init(&sampling);
    sampling.temperature = o->temperature;
    sampling.seed = o->seed;
    const llm_sampling_params *sp = o->temperature > 0 ? &sampling : NULL;
    fprintf(stderr, "llm-bench: %zu %s requests at batch 1, without and with --spec %s (k %s)\n",
            n, bench_workload_name(o->workload), spec_name(o->spec_mode),
            o->spec_k ? "fixed" : "adaptive");
    totals tb = {0}, ts = {0};
    uint64_t steps = 0, drafted = 0, accepted = 0;
    size_t mismatched = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        /* Alternate which goes first, so that drift in the machine's speed
         * does not favour one. */
        for (int pass = 0; pass < 2 && rc == 0; pass++) {
            bool with = (pass == 0) == (i % 2 == 1);
            rc = run_one(with ? s_spec : s_base, prompts[i], n_prompt[i], max_new[i], !text, sp,
                         with ? o->spec_mode : LLM_SPEC_NONE, (uint32_t)o->spec_k,
                         with ? &spec[i] : &base[i]);
        }
        if (rc) break;
        add_run(&tb, &base[i]);
        add_run(&ts, &spec[i]);
        steps += spec[i].spec_steps;
        drafted += spec[i].drafted;
        accepted += spec[i].accepted;
        bool same = base[i].n_tokens == spec[i].n_tokens &&
                    memcmp(base[i].toks, spec[i].toks, base[i].n_tokens * sizeof(llm_token)) == 0;
        mismatched += !same;
        printf("request %2zu: prompt %4zu, %4u tokens | without %7.3f s | with %7.3f s | %5.2fx"
               " | drafts %4llu accepted %4llu%s\n",
               i, n_prompt[i], spec[i].n_tokens, base[i].wall_s, spec[i].wall_s,
               ratio(base[i].wall_s, spec[i].wall_s), (unsigned long long)spec[i].drafted,
               (unsigned long long)spec[i].accepted, same ? "" : " | OUTPUT DIFFERS");
    }
    if (rc) goto out;
    double speedup = ratio(tb.wall_s, ts.wall_s);
    double decode_speedup = ratio(ratio((double)ts.decode_tokens, ts.decode_s),
                                  ratio((double)tb.decode_tokens, tb.decode_s));
    double acceptance = drafted ? (double)accepted / (double)drafted : NAN;
    double mean_len = steps ? (double)accepted / (double)steps : NAN;
    printf("\nwithout: %llu tokens in %.3f s (%.1f tok/s)   with: %llu tokens in %.3f s "
           "(%.1f tok/s)\n",
           (unsigned long long)tb.tokens, tb.wall_s, ratio((double)tb.tokens, tb.wall_s),
           (unsigned long long)ts.tokens, ts.wall_s, ratio((double)ts.tokens, ts.wall_s));
    printf("speedup %.2fx (decode only %.2fx); %llu steps checked %llu drafts, accepted %llu "
           "(acceptance %.1f%%, %.2f accepted per step)\n",
           speedup, decode_speedup, (unsigned long long)steps, (unsigned long long)drafted,
           (unsigned long long)accepted, acceptance * 100, mean_len);
    bool greedy_exact = !sp || o->spec_mode == LLM_SPEC_NGRAM;
    if (mismatched)
        printf("%zu of %zu outputs differ from the run without speculation%s\n", mismatched, n,
               greedy_exact ? " (they must not: engine problem)" : " (expected when a draft "
                                                                   "model samples)");
    fflush(stdout);
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) {
            fprintf(stderr, "llm-bench: cannot write '%s'\n", o->json);
            rc = 2;
            goto out;
        }
        fputs("{\n  \"config\": {\"model\": ", f);
        bench_json_str(f, o->model);
        fprintf(f, ", \"spec\": \"%s\", \"spec_k\": %ld, \"draft_model\": ", spec_name(o->spec_mode),
                o->spec_k);
        if (o->draft_model)
            bench_json_str(f, o->draft_model);
        else
            fputs("null", f);
        fprintf(f, ", \"workload\": \"%s\", \"requests\": %zu, \"max_new_tokens\": %ld, "
                   "\"temperature\": ",
                bench_workload_name(o->workload), n, text ? out_hi : -1L);
        bench_json_num(f, o->temperature);
        fprintf(f, ", \"threads\": %ld, \"seed\": %llu, \"batch\": 1},\n", o->threads,
                (unsigned long long)o->seed);
        json_totals(f, "without", &tb);
        json_totals(f, "with", &ts);
        fputs("  \"speedup\": ", f);
        bench_json_num(f, speedup);
        fputs(",\n  \"decode_speedup\": ", f);
        bench_json_num(f, decode_speedup);
        fputs(",\n  \"acceptance_rate\": ", f);
        bench_json_num(f, acceptance);
        fputs(",\n  \"mean_accepted_len\": ", f);
        bench_json_num(f, mean_len);
        fprintf(f,
                ",\n  \"spec_steps\": %llu,\n  \"draft_tokens\": %llu,\n  \"accepted_tokens\": "
                "%llu,\n  \"outputs_differ\": %zu,\n  \"requests_detail\": [\n",
                (unsigned long long)steps, (unsigned long long)drafted,
                (unsigned long long)accepted, mismatched);
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "    {\"prompt_tokens\": %zu, \"tokens\": %u, \"without_s\": ", n_prompt[i],
                    spec[i].n_tokens);
            bench_json_num(f, base[i].wall_s);
            fputs(", \"with_s\": ", f);
            bench_json_num(f, spec[i].wall_s);
            fprintf(f, ", \"draft_tokens\": %llu, \"accepted_tokens\": %llu}%s\n",
                    (unsigned long long)spec[i].drafted, (unsigned long long)spec[i].accepted,
                    i + 1 < n ? "," : "");
        }
        fputs("  ]\n}\n", f);
        if (fclose(f) != 0) {
            fprintf(stderr, "llm-bench: writing '%s' failed\n", o->json);
            rc = 2;
        }
    }
    if (rc == 0 && mismatched && greedy_exact) {
        fprintf(stderr, "llm-bench: the engine misbehaved: speculation changed the output\n");
        rc = 2;
    }
out:
    for (size_t i = 0; prompts && i < n; i++) free(prompts[i]);
    for (size_t i = 0; base && spec && i < n; i++) {
        free(base[i].toks);
        free(spec[i].toks);
    }
    free(prompts);
    free(n_prompt);
    free(max_new);
    free(base);
    free(spec);
    bench_workload_free(&w);
    llm_session_free(s_base);
    llm_session_free(s_spec);
    llm_model_free(draft);
    return rc;
}
