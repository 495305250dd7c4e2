/* Writes the fuzzers' seed corpora (tests/fuzz/corpus/<target>/) with the
 * library's own GGUF writer and test-model generator, so the seeds are
 * always files the current code accepts. Deterministic: running it again
 * gives the same bytes.
 *
 *   make fuzz-corpus      (builds and runs it: make_corpus tests/fuzz/corpus)
 *
 * Budget: under 50 KB per target. */
#include "gguf/gguf.h"
#include "model/testmodel.h"
#include "state/state.h"

#include "fuzz_lora.h"
#include "fuzz_state.h"

#include <zlib.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_out;

static void die(const char *what) {
    fprintf(stderr, "make_corpus: %s: %s\n", what, llmi_error_message());
    exit(1);
}
#define OK(expr)                                                                                   \
    do {                                                                                           \
        if ((expr) != LLM_OK)                                                                      \
            die(#expr);                                                                            \
    } while (0)

static void mkdir_p(const char *dir) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                die(tmp);
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        die(tmp);
}

static void save(const char *target, const char *name, const void *data, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_out, target);
    mkdir_p(path);
    snprintf(path, sizeof path, "%s/%s/%s", g_out, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        die(path);
    printf("%-40s %6zu bytes\n", path, size);
}

static void save_writer(const char *target, const char *name, llmi_gguf_writer *w) {
    void *data;
    size_t size;
    OK(llmi_gguf_writer_to_memory(w, &data, &size));
    save(target, name, data, size);
    llmi_free(data);
}

/* ---- gguf: every value type, arrays, tensors of every type ---- */

static void gguf_seeds(void) {
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int64_t i64 = -5000000000ll;
    uint64_t u64 = 5000000000ull;
    double f64 = 2.5;
    OK(llmi_gguf_w_scalar(w, "t.u8", LLMI_GGUF_U8, &u8));
    OK(llmi_gguf_w_scalar(w, "t.i8", LLMI_GGUF_I8, &i8));
    OK(llmi_gguf_w_scalar(w, "t.u16", LLMI_GGUF_U16, &u16));
    OK(llmi_gguf_w_scalar(w, "t.i16", LLMI_GGUF_I16, &i16));
    OK(llmi_gguf_w_u32(w, "t.u32", 4000000000u));
    OK(llmi_gguf_w_i32(w, "t.i32", -7));
    OK(llmi_gguf_w_f32(w, "t.f32", 0.125f));
    OK(llmi_gguf_w_bool(w, "t.bool", true));
    OK(llmi_gguf_w_str(w, "t.string", "hello \xe2\x96\x81 world"));
    OK(llmi_gguf_w_scalar(w, "t.u64", LLMI_GGUF_U64, &u64));
    OK(llmi_gguf_w_scalar(w, "t.i64", LLMI_GGUF_I64, &i64));
    OK(llmi_gguf_w_scalar(w, "t.f64", LLMI_GGUF_F64, &f64));
    static const char *const strs[] = {"a", "", "<|im_start|>", "\xc4\xa0the"};
    OK(llmi_gguf_w_arr_str(w, "t.arr.str", strs, 4));
    static const float fs[] = {1, -2, 0.5f};
    OK(llmi_gguf_w_arr_f32(w, "t.arr.f32", fs, 3));
    static const int32_t is[] = {1, 3, 6, 1};
    OK(llmi_gguf_w_arr_i32(w, "t.arr.i32", is, 4));
    static const uint8_t u8s[] = {1, 2, 3};
    OK(llmi_gguf_w_arr(w, "t.arr.u8", LLMI_GGUF_U8, u8s, 3));
    static const bool bs[] = {true, false};
    OK(llmi_gguf_w_arr(w, "t.arr.bool", LLMI_GGUF_BOOL, bs, 2));
    static const uint64_t u64s[] = {1, 1ull << 40};
    OK(llmi_gguf_w_arr(w, "t.arr.u64", LLMI_GGUF_U64, u64s, 2));
    static const double f64s[] = {1e300, -0.0};
    OK(llmi_gguf_w_arr(w, "t.arr.f64", LLMI_GGUF_F64, f64s, 2));
    OK(llmi_gguf_w_arr(w, "t.arr.empty", LLMI_GGUF_I16, NULL, 0));
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)(i % 13) * 0.25f - 1.0f;
    static const struct {
        const char *name;
        llmi_ttype type;
    } types[] = {{"w.f32", LLMI_T_F32},   {"w.f16", LLMI_T_F16},   {"w.bf16", LLMI_T_BF16},
                 {"w.q4_0", LLMI_T_Q4_0}, {"w.q4_1", LLMI_T_Q4_1}, {"w.q8_0", LLMI_T_Q8_0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint64_t ne[2] = {32, 2};
        OK(llmi_gguf_w_tensor(w, types[i].name, types[i].type, 2, ne, data));
    }
    uint64_t ne4[4] = {2, 2, 2, 2};
    OK(llmi_gguf_w_tensor(w, "w.4d", LLMI_T_F32, 4, ne4, data));
    save_writer("gguf", "all-types.gguf", w);
    llmi_gguf_writer_free(w);

    /* The same layout as version 2 (identical encoding for these fields). */
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "general.architecture", "llama"));
    uint32_t align = 64;
    OK(llmi_gguf_w_scalar(w, "general.alignment", LLMI_GGUF_U32, &align));
    uint64_t ne[1] = {8};
    OK(llmi_gguf_w_tensor(w, "a", LLMI_T_F32, 1, ne, data));
    OK(llmi_gguf_w_tensor(w, "b", LLMI_T_F16, 1, ne, data));
    void *buf;
    size_t size;
    OK(llmi_gguf_writer_to_memory(w, &buf, &size));
    save("gguf", "aligned64.gguf", buf, size);
    ((uint8_t *)buf)[4] = 2;
    save("gguf", "aligned64-v2.gguf", buf, size);
    llmi_free(buf);
    llmi_gguf_writer_free(w);

    /* Metadata only, no tensors. */
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "tokenizer.ggml.model", "llama"));
    static const char *const toks[] = {"<unk>", "<s>", "</s>",
                                       "\xe2\x96\x81"
                                       "a",
                                       "b"};
    OK(llmi_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 5));
    save_writer("gguf", "metadata-only.gguf", w);
    llmi_gguf_writer_free(w);
}

/* ---- model: tiny test models of several types ---- */

static void model_seed(const char *name, llmi_ttype type, uint32_t n_embd, uint32_t n_ff,
                       uint32_t n_layer, bool tied) {
    llmi_testmodel_params p;
    llmi_testmodel_params_init(&p);
    p.type = type;
    p.n_embd = n_embd;
    p.n_ff = n_ff;
    p.n_layer = n_layer;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_ctx = 64;
    p.tied_embeddings = tied;
    p.name = "fuzz";
    void *data;
    size_t size;
    OK(llmi_testmodel_to_memory(&p, &data, &size));
    save("model", name, data, size);
    llmi_free(data);
}

/* ---- state: states of fuzz_state.h's model, each also as header + raw
 * payload (what fuzz_state's fix-up turns back into a valid state) ---- */

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The state of `buf` with its first record naming a LoRA adapter (a made-up
 * fingerprint, scale 0.5), as NAME-lora.state and NAME-lora-raw.bin: the
 * loaded sequence waits for that adapter. */
static void lora_seed(const char *name, const uint8_t *header, uint32_t hl, uint8_t *raw,
                      uint64_t raw_len) {
    put_le(raw + 8, 0x5eed0fa1ada97e12ull, 8);
    put_le(raw + 16, 0x3f000000u, 4); /* 0.5f */
    uLongf comp = compressBound((uLong)raw_len);
    uint8_t *out = malloc(hl + comp);
    memcpy(out, header, hl);
    if (compress2(out + hl, &comp, raw, (uLong)raw_len, 1) != Z_OK)
        die("deflating a state seed");
    put_le(out + hl - 20, comp, 8);
    put_le(out + hl - 12, (uint32_t)crc32(0, raw, (uInt)raw_len), 4);
    put_le(out + hl - 8, (uint32_t)crc32(0, out + hl, (uInt)comp), 4);
    put_le(out + hl - 4, (uint32_t)crc32(0, out, hl - 4), 4);
    char file[64];
    snprintf(file, sizeof file, "%s-lora.state", name);
    save("state", file, out, hl + comp);
    memcpy(out, header, hl);
    memcpy(out + hl, raw, raw_len);
    snprintf(file, sizeof file, "%s-lora-raw.bin", name);
    save("state", file, out, hl + raw_len);
    free(out);
}

static void state_seed(const char *name, llm_session *s, const llm_seq_id *seq, bool lora) {
    size_t bound = 0, size = 0;
    if (seq)
        llm_seq_state_save(s, *seq, NULL, 0, &bound);
    else
        llm_session_state_save(s, NULL, 0, &bound);
    uint8_t *buf = malloc(bound);
    OK(seq ? llm_seq_state_save(s, *seq, buf, bound, &size)
           : llm_session_state_save(s, buf, bound, &size));
    char file[64];
    snprintf(file, sizeof file, "%s.state", name);
    save("state", file, buf, size);
    uint32_t hl = (uint32_t)buf[12] | (uint32_t)buf[13] << 8 | (uint32_t)buf[14] << 16 |
                  (uint32_t)buf[15] << 24;
    uint64_t raw_len = 0;
    for (int i = 7; i >= 0; i--)
        raw_len = raw_len << 8 | buf[hl - 28 + i]; /* versions 2 and 3 */
    uint8_t *raw = malloc(hl + raw_len);
    memcpy(raw, buf, hl);
    uLongf got = (uLongf)raw_len;
    if (uncompress(raw + hl, &got, buf + hl, (uLong)(size - hl)) != Z_OK || got != raw_len)
        die("inflating a state seed");
    snprintf(file, sizeof file, "%s-raw.bin", name);
    save("state", file, raw, hl + raw_len);
    if (lora)
        lora_seed(name, buf, hl, raw + hl, raw_len);
    free(raw);
    free(buf);
}

static void decode_seed(llm_session *s, llm_seq_id seq, uint32_t pos, const llm_token *t,
                        uint32_t n) {
    llm_batch *b;
    OK(llm_batch_create(n, &b));
    for (uint32_t i = 0; i < n; i++)
        OK(llm_batch_add(b, seq, pos + i, t[i], false));
    OK(llm_session_decode(s, b));
    llm_batch_free(b);
}

static void state_seeds(void) {
    llm_model *m = fuzz_state_model();
    if (!m)
        die("fuzz_state model");
    static const llm_token toks[] = {1, 17, 42, 99, 200, 300, 7, 8, 9};
    static const llm_kv_type types[3] = {LLM_KV_F32, LLM_KV_F16, LLM_KV_FP8_E4M3};
    static const char *const names[3] = {"seq-f32", "seq-f16", "seq-fp8"};
    for (int t = 0; t < 3; t++) {
        llm_session_params p;
        llm_session_params_init(&p);
        p.n_threads = 1;
        p.n_ctx = 48;
        p.kv_type = types[t];
        p.kv_cache_bytes = 1 << 20;
        llm_session *s;
        OK(llm_session_create(m, &p, &s));
        llm_seq_id a, b;
        OK(llm_seq_open(s, &a));
        decode_seed(s, a, 0, toks, 6);
        state_seed(names[t], s, &a, t == 0);
        if (t == 0) { /* a session: the sequence and a fork that went on */
            OK(llm_seq_fork(s, a, &b));
            decode_seed(s, b, 6, toks + 6, 3);
            state_seed("session", s, NULL, true);
        }
        llm_session_free(s);
    }
    llmi_model_free(m);
}

/* ---- safetensors: header length, JSON header (padded to 8), data ---- */

static void st_seed(const char *name, const char *header, size_t data_bytes) {
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8, n = 8 + hl + pad + data_bytes;
    unsigned char *b = calloc(1, n);
    if (!b)
        die("safetensors seed");
    uint64_t len = hl + pad;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', pad);
    save("safetensors", name, b, n);
    free(b);
}

static void safetensors_seeds(void) {
    st_seed("one-f32.safetensors",
            "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    st_seed("metadata.safetensors",
            "{\"__metadata__\":{\"format\":\"pt\"},\"a.bias\":{\"dtype\":\"F16\",\"shape\":[3],"
            "\"data_offsets\":[0,6]},\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[1,2,2],"
            "\"data_offsets\":[6,14]}}",
            14);
    st_seed("empty-tensor.safetensors",
            "{\"e\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},\"x\":{\"dtype\":"
            "\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
            8);
    st_seed("no-tensors.safetensors", "{}", 0);
    st_seed("bad-dtype.safetensors",
            "{\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    st_seed("overlap.safetensors",
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":"
            "\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            12);
}

/* ---- tokenize and chat: text ---- */

static void text_seed(const char *target, const char *name, const char *text, size_t n) {
    save(target, name, text, n);
}
#define TEXT(target, name, lit) text_seed(target, name, lit, sizeof lit - 1)

/* ---- lora: adapters for fuzz_lora.h's model, as GGUF and as PEFT ---- */

static void lora_gguf_seed(const char *name, const char *weight, uint64_t in, uint64_t out,
                           uint64_t rank, llmi_ttype type) {
    llmi_gguf_writer *w;
    OK(llmi_gguf_writer_create(&w));
    OK(llmi_gguf_w_str(w, "general.architecture", "llama"));
    OK(llmi_gguf_w_str(w, "general.type", "adapter"));
    OK(llmi_gguf_w_str(w, "adapter.type", "lora"));
    OK(llmi_gguf_w_f32(w, "adapter.lora.alpha", 4.0f));
    float data[256];
    for (int i = 0; i < 256; i++)
        data[i] = (float)(i % 7) * 0.125f - 0.375f;
    char t[96];
    uint64_t ne_a[2] = {in, rank}, ne_b[2] = {rank, out};
    snprintf(t, sizeof t, "%s.lora_a", weight);
    OK(llmi_gguf_w_tensor(w, t, type, 2, ne_a, data));
    snprintf(t, sizeof t, "%s.lora_b", weight);
    OK(llmi_gguf_w_tensor(w, t, type, 2, ne_b, data));
    void *buf;
    size_t size;
    OK(llmi_gguf_writer_to_memory(w, &buf, &size));
    uint8_t *in_buf = malloc(size + 1);
    if (!in_buf)
        die("lora seed");
    in_buf[0] = FUZZ_LORA_GGUF;
    memcpy(in_buf + 1, buf, size);
    save("lora", name, in_buf, size + 1);
    free(in_buf);
    llmi_free(buf);
    llmi_gguf_writer_free(w);
}

static void lora_peft_seed(void) {
    static const char config[] = "{\"peft_type\":\"LORA\",\"r\":2,\"lora_alpha\":4,"
                                 "\"bias\":\"none\",\"use_rslora\":false}";
    static const char header[] =
        "{\"base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight\":"
        "{\"dtype\":\"F16\",\"shape\":[2,64],\"data_offsets\":[0,256]},"
        "\"base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight\":"
        "{\"dtype\":\"F16\",\"shape\":[32,2],\"data_offsets\":[256,384]}}";
    uint8_t buf[1024];
    size_t n = 0, cl = sizeof config - 1, hl = sizeof header - 1;
    buf[n++] = FUZZ_LORA_PEFT;
    buf[n++] = (uint8_t)(cl & 0xff);
    buf[n++] = (uint8_t)(cl >> 8);
    memcpy(buf + n, config, cl);
    n += cl;
    for (int i = 0; i < 8; i++)
        buf[n++] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + n, header, hl);
    n += hl;
    for (int i = 0; i < 192; i++) {
        uint16_t h = llmi_f32_to_f16((float)(i % 5) * 0.25f - 0.5f);
        memcpy(buf + n, &h, 2);
        n += 2;
    }
    save("lora", "peft-k.bin", buf, n);
}

static void lora_seeds(void) {
    lora_gguf_seed("q-f32.bin", "blk.0.attn_q.weight", 64, 64, 2, LLMI_T_F32);
    lora_gguf_seed("down-f16.bin", "blk.1.ffn_down.weight", 128, 64, 2, LLMI_T_F16);
    lora_gguf_seed("up-bf16.bin", "blk.0.ffn_up.weight", 64, 128, 1, LLMI_T_BF16);
    lora_peft_seed();
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus OUTDIR (normally tests/fuzz/corpus)\n");
        return 2;
    }
    g_out = argv[1];
    gguf_seeds();

    model_seed("f32-tied.gguf", LLMI_T_F32, 4, 4, 1, true);
    model_seed("f16-2layers.gguf", LLMI_T_F16, 4, 8, 2, false);
    model_seed("q4_0.gguf", LLMI_T_Q4_0, 32, 32, 1, true);

    state_seeds();
    safetensors_seeds();
    lora_seeds();

    TEXT("tokenize", "english.txt",
         "Hello world! The quick brown fox jumps over the lazy dog.\n"
         "It's 2024; we've got 3,141.59 reasons   to\ttest.");
    TEXT("tokenize", "unicode.txt",
         "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
         "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd "
         "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
         "\xe2\x96\x81x \xc2\xa0\xe3\x80\x80");
    TEXT("tokenize", "special.txt",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
         "<|endoftext|><s></s><tool> <|im_start|");
    TEXT("tokenize", "code.txt",
         "int main(void) {\n    return x[i] != 0 && y >= 10;\n}\n\n\n"
         "    // comment\r\n");
    TEXT("tokenize", "invalid.txt", "ok \xc3( \xed\xa0\x80 \xf4\x90\x80\x80 \xff");
    TEXT("tokenize", "ids.bin", "\x00\x00\x01\x01\x30\x01\x31\x01\x32\x01\xff\xff\xe9\x00\xc3\x00");

    /* chat: gen flag, then messages split at NUL; 0x1f separates a role */
    TEXT("chat", "one-user.bin", "\x01Hello!");
    TEXT("chat", "sys-user-asst.bin",
         "\x01"
         "Be brief.\0What is 2+2?\0It is 4.");
    TEXT("chat", "roles.bin", "\x00user\x1f  hi there \n\0tool\x1f{\"x\": 1}\0system\x1f\t");
    TEXT("chat", "unicode.bin", "\x01\xe3\x80\x80\xc2\xa0 x \xe2\x80\x83\0caf\xc3\xa9\0\0");
    TEXT("chat", "specials.bin", "\x01<|im_start|>assistant\n<|im_end|>\0<|eot_id|>");

    /* hf_tokenizer: tokenizer.json \0 tokenizer_config.json \0 text */
    TEXT("hf_tokenizer", "gpt2.bin",
         "{\"added_tokens\":[{\"id\":5,\"content\":\"<|end|>\",\"special\":true},"
         "{\"id\":6,\"content\":\"<tool>\",\"special\":false}],\"normalizer\":null,"
         "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
         "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
         "\"b\":1,\"ab\":2,\"\\u0120\":3,\"\\u0120ab\":4,\"<|end|>\":5,\"<tool>\":6},"
         "\"merges\":[\"a b\",[\"\\u0120\",\"ab\"]]}}\0"
         "{\"eos_token\":{\"content\":\"<|end|>\"},\"add_eos_token\":true,"
         "\"chat_template\":[{\"name\":\"default\",\"template\":\"x\"}]}\0"
         "ab ab<tool> b<|end|>");
    TEXT("hf_tokenizer", "llama3-split.bin",
         "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
         "\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
         "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
         "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
         "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},"
         "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"<s>\":0,\"1\":1,"
         "\"2\":2,\"12\":3,\"x\":4},\"merges\":[\"1 2\"]},"
         "\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true}]}\0\0"
         "x12 1212x");
    TEXT("hf_tokenizer", "spm-metaspace.bin",
         "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
         "{\"id\":1,\"content\":\"<s>\",\"special\":true}],\"pre_tokenizer\":{\"type\":"
         "\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":false},"
         "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"vocab\":{"
         "\"<unk>\":0,\"<s>\":1,\"<0x41>\":2,\"\\u2581\":3,\"x\":4,\"\\u2581x\":5},"
         "\"merges\":[[\"\\u2581\",\"x\"]]}}\0"
         "{\"bos_token\":\"<s>\",\"add_bos_token\":true}\0"
         "x A xx<s>x");
    TEXT("hf_tokenizer", "spm-prepend.bin",
         "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
         "\"prepend\":\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
         "\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\","
         "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"\\u2581\":1,\"a\":2,\"b\":3,"
         "\"ab\":4,\"\\u2581ab\":5},\"merges\":[\"a b\",\"\\u2581 ab\"]}}\0{}\0ab ba");
    TEXT("hf_tokenizer", "wordpiece.bin",
         "{\"added_tokens\":[{\"id\":0,\"content\":\"[UNK]\",\"special\":true},"
         "{\"id\":1,\"content\":\"[CLS]\",\"special\":true},{\"id\":2,\"content\":"
         "\"[SEP]\",\"special\":true}],\"normalizer\":{\"type\":\"BertNormalizer\","
         "\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,"
         "\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
         "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",2],"
         "\"cls\":[\"[CLS]\",1]},\"model\":{\"type\":\"WordPiece\",\"unk_token\":"
         "\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":8,"
         "\"vocab\":{\"[UNK]\":0,\"[CLS]\":1,\"[SEP]\":2,\"un\":3,\"##able\":4,"
         "\"cafe\":5,\"\u4e2d\":6,\",\":7,\"##a\":8,\"a\":9}}}\0"
         "{\"unk_token\":\"[UNK]\"}\0"
         "Unable, CAF\xc3\x89 \xe4\xb8\xad\xe6\x96\x87 aaaaaaaaaa\t\xed\x95\x9c\x01[CLS]");
    TEXT("hf_tokenizer", "unigram.bin",
         "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0.0],"
         "[\"a\",-1.5]]}}");
    return 0;
}
