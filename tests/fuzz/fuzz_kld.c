/* llm-perplexity's base file (examples/llm-perplexity/kld.h) from arbitrary
 * bytes: the header decodes and re-encodes to the same bytes or is refused
 * with a message; a file the reader accepts is read record by record
 * against made-up logits, each record compared or refused, never read past
 * its end; the statistics print. No crash, leak or undefined behaviour. */
#include "../../examples/llm-perplexity/kld.c"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kld_header h;
    const char *err = kld_header_decode(data, size, &h);
    if (err) {
        FUZZ_CHECK(err[0] != '\0', "an empty message");
        return 0;
    }
    uint8_t again[KLD_HEADER_BYTES];
    kld_header_encode(&h, again);
    FUZZ_CHECK(memcmp(again, data, sizeof again) == 0, "the header does not round-trip");
    if (h.n_vocab > 1 << 16) /* the logits row below is n_vocab floats */
        return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f)
        return 0;
    kld_reader r;
    if (kld_reader_attach(&r, f, &h, &err) != 0) {
        FUZZ_CHECK(err && err[0] != '\0', "a refusal without a message");
        return 0;
    }
    FUZZ_CHECK((size - KLD_HEADER_BYTES) / kld_record_bytes(h.top_k) == h.n_scored,
               "accepted %llu records in %zu bytes", (unsigned long long)h.n_scored, size);
    float *logits = malloc((size_t)h.n_vocab * sizeof *logits);
    if (logits) {
        for (uint32_t i = 0; i < h.n_vocab; i++)
            logits[i] = (float)(i % 7) - 3.0f;
        const double lse = kld_log_sum_exp(logits, h.n_vocab);
        for (uint64_t i = 0; i < h.n_scored; i++)
            if (kld_reader_row(&r, logits, lse, 1.0, &err) != 0)
                break;
        FILE *sink = fopen("/dev/null", "w");
        if (sink) {
            kld_reader_print(&r, sink);
            fclose(sink);
        }
        free(logits);
    }
    kld_reader_close(&r);
    return 0;
}
