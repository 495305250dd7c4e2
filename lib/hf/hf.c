/* Opening a checkpoint folder (hf/hf.h): config.json, the safetensors
 * files (one, or shards listed by model.safetensors.index.json), the
 * tokenizer, generation_config.json and a sentence-transformers pooling
 * config (modules.json) become one assembled llmi_gguf. */
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* JSON side files are small; a bound keeps a hostile one from exhausting
 * memory before it is parsed. */
#define JSON_FILE_MAX (64u << 20)

static char *join(const char *folder, const char *name) {
    size_t a = strlen(folder), b = strlen(name);
    char *p = llmi_malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, folder, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

bool llmi_hf_is_folder(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return false;
    /* Any config.json makes it a checkpoint folder: one that is not a
     * regular file is then refused naming config.json, not the folder. */
    char *cfg = join(path, "config.json");
    bool ok = cfg && lstat(cfg, &sb) == 0;
    llmi_free(cfg);
    return ok;
}

/* Reads folder/name NUL-terminated; *absent (when non-NULL) reports a
 * missing file as LLM_OK with *data NULL (hf_internal.h). */
llm_status llmi_hf_read_text(const char *folder, const char *name, bool *absent, char **data,
                             size_t *len) {
    *data = NULL;
    *len = 0;
    char *path = join(folder, name);
    if (!path)
        return llmi_oom("path");
    int fd = -1;
    uint64_t file_size = 0;
    llm_status st = llmi_open_regular(path, name, absent, &fd, &file_size);
    llmi_free(path);
    if (st != LLM_OK || fd < 0)
        return st;
    if (file_size > JSON_FILE_MAX) {
        st = llmi_error(LLM_ERR_LIMIT, "%s has %llu bytes (at most %u are read)", name,
                        (unsigned long long)file_size, JSON_FILE_MAX);
        goto out;
    }
    size_t size = (size_t)file_size;
    char *buf = llmi_malloc(size + 1);
    if (!buf) {
        st = llmi_oom(name);
        goto out;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            st = llmi_error(LLM_ERR_IO, "cannot read %s: %s", name,
                            r < 0 ? strerror(errno) : "file shrank");
            llmi_free(buf);
            goto out;
        }
        got += (size_t)r;
    }
    buf[size] = '\0';
    if ((st = llmi_hf_json_check_nul(name, buf, size, 0)) != LLM_OK) {
        llmi_free(buf);
        goto out;
    }
    *data = buf;
    *len = size;
out:
    close(fd);
    return st;
}

typedef struct hf_folder {
    const char *folder;
    bool use_mmap;
    llmi_st_file *files;
    char **file_names;
    size_t n_files;
    llmi_hf_source *src;
    size_t n_src;
} hf_folder;

static void folder_free(hf_folder *h) {
    for (size_t i = 0; i < h->n_files; i++) {
        llmi_st_close(&h->files[i]);
        llmi_free(h->file_names[i]);
    }
    llmi_free(h->files);
    llmi_free(h->file_names);
    llmi_free(h->src);
}

/* A shard name from the index must be a plain file in the folder. */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\');
}

static llm_status open_file(hf_folder *h, const char *name, size_t *index) {
    for (size_t i = 0; i < h->n_files; i++)
        if (strcmp(h->file_names[i], name) == 0) {
            *index = i;
            return LLM_OK;
        }
    size_t i = h->n_files;
    h->file_names[i] = llmi_strdup(name);
    char *path = join(h->folder, name);
    if (!h->file_names[i] || !path) {
        llmi_free(path);
        llmi_free(h->file_names[i]);
        h->file_names[i] = NULL;
        return llmi_oom("shard name");
    }
    h->n_files++;
    struct stat sb;
    llm_status st;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        st = llmi_error(LLM_ERR_BAD_FORMAT,
                        "model.safetensors.index.json: weight_map names shard '%s', which is not "
                        "in the folder",
                        name);
    else
        st = llmi_st_open(path, h->file_names[i], h->use_mmap, &h->files[i]);
    llmi_free(path);
    *index = i;
    return st;
}

static int src_cmp(const void *a, const void *b) {
    return strcmp(((const llmi_hf_source *)a)->name, ((const llmi_hf_source *)b)->name);
}

/* The converter's order: shards by file name, each shard's tensors by name
 * (the order the safetensors package lists them). Tensors are listed in the
 * assembled GGUF in this order, as the converter writes them, so the two
 * give the same model fingerprint. */
static int src_converter_cmp(const void *a, const void *b) {
    const llmi_hf_source *x = a, *y = b;
    int by_file = strcmp(x->file, y->file);
    return by_file ? by_file : strcmp(x->name, y->name);
}

static llm_status open_single(hf_folder *h) {
    h->files = llmi_calloc(1, sizeof *h->files);
    h->file_names = llmi_calloc(1, sizeof *h->file_names);
    if (!h->files || !h->file_names)
        return llmi_oom("safetensors file table");
    size_t fi;
    char *path = join(h->folder, "model.safetensors");
    if (!path)
        return llmi_oom("path");
    struct stat sb;
    bool present = stat(path, &sb) == 0;
    llmi_free(path);
    if (!present)
        return llmi_error(LLM_ERR_IO, "the folder has neither model.safetensors nor "
                                      "model.safetensors.index.json");
    LLMI_TRY(open_file(h, "model.safetensors", &fi));
    const llmi_st_file *f = &h->files[fi];
    if (f->n_tensors) {
        h->src = llmi_calloc(f->n_tensors, sizeof *h->src);
        if (!h->src)
            return llmi_oom("tensor list");
    }
    for (size_t i = 0; i < f->n_tensors; i++)
        h->src[h->n_src++] =
            (llmi_hf_source){f->tensors[i].name, &f->tensors[i], h->file_names[fi]};
    return LLM_OK;
}

static llm_status open_index(hf_folder *h, const char *json, size_t len) {
    static const char *const what = "model.safetensors.index.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: not valid JSON", what);
    llm_status st = LLM_OK;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: field 'weight_map' is missing or not an object",
                        what);
        goto done;
    }
    size_t n = (size_t)cJSON_GetArraySize(map);
    h->files = llmi_calloc(n ? n : 1, sizeof *h->files);
    h->file_names = llmi_calloc(n ? n : 1, sizeof *h->file_names);
    h->src = llmi_calloc(n ? n : 1, sizeof *h->src);
    if (!h->files || !h->file_names || !h->src) {
        st = llmi_oom("shard table");
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
            st = llmi_error(LLM_ERR_BAD_FORMAT,
                            "%s: weight_map entry '%s' is not the name of a file in the folder",
                            what, e->string);
            goto done;
        }
        size_t fi;
        if ((st = open_file(h, e->valuestring, &fi)) != LLM_OK)
            goto done;
        const llmi_st_file *f = &h->files[fi];
        const llmi_st_tensor *t = llmi_st_find(f->tensors, f->n_tensors, e->string);
        if (!t) {
            st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: tensor '%s' is not in shard '%s'", what,
                            e->string, e->valuestring);
            goto done;
        }
        /* the table's names outlive the JSON: they are the shard's */
        h->src[h->n_src++] = (llmi_hf_source){t->name, t, h->file_names[fi]};
    }
    qsort(h->src, h->n_src, sizeof *h->src, src_cmp);
    for (size_t i = 1; i < h->n_src; i++)
        if (strcmp(h->src[i - 1].name, h->src[i].name) == 0) {
            st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: weight_map lists tensor '%s' twice", what,
                            h->src[i].name);
            goto done;
        }
    qsort(h->src, h->n_src, sizeof *h->src, src_converter_cmp);
done:
    cJSON_Delete(root);
    return st;
}

/* generation_config.json: llama.cpp's general.sampling.* keys. */
static llm_status generation_keys(const char *folder, llmi_gguf_writer *w) {
    static const char *const what = "generation_config.json";
    bool absent = false;
    char *json;
    size_t len;
    LLMI_TRY(llmi_hf_read_text(folder, what, &absent, &json, &len));
    if (absent)
        return LLM_OK;
    cJSON *root = cJSON_ParseWithLength(json, len);
    llmi_free(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: not a JSON object", what);
    }
    llm_status st = LLM_OK;
    static const struct {
        const char *field, *key;
        bool integer;
        double lo, hi;
    } fields[] = {
        {"temperature", "general.sampling.temp", false, 0.0, 1e6},
        {"top_p", "general.sampling.top_p", false, 0.0, 1.0},
        {"top_k", "general.sampling.top_k", true, 0.0, 2147483647.0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0] && st == LLM_OK; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, fields[i].field);
        if (!v || cJSON_IsNull(v))
            continue;
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(d >= fields[i].lo && d <= fields[i].hi) || (fields[i].integer && d != floor(d)))
            st = llmi_error(LLM_ERR_BAD_FORMAT, "%s: field '%s' is not a number in [%g, %g]", what,
                            fields[i].field, fields[i].lo, fields[i].hi);
        else if (fields[i].integer)
            st = llmi_gguf_w_i32(w, fields[i].key, (int32_t)d);
        else
            st = llmi_gguf_w_f32(w, fields[i].key, (float)d);
    }
    cJSON_Delete(root);
    return st;
}

/* A sentence-transformers folder's pooling (modules.json names the Pooling
 * module's folder, whose config.json says the mode) as "<arch>.pooling_type",
 * with the numbers and the refusals of llama.cpp's converter: mean 1, CLS 2,
 * last token 3; other modes (max, weighted mean) are refused. A folder
 * without modules.json, or without a Pooling module, says nothing. */
static llm_status read_json(const char *folder, const char *name, bool *absent, cJSON **out) {
    *out = NULL;
    char *json;
    size_t len;
    LLMI_TRY(llmi_hf_read_text(folder, name, absent, &json, &len));
    if (absent && *absent)
        return LLM_OK;
    *out = cJSON_ParseWithLength(json, len);
    llmi_free(json);
    if (!*out)
        return llmi_error(LLM_ERR_BAD_FORMAT, "%s: not JSON", name);
    return LLM_OK;
}

static llm_status pooling_mode(const cJSON *cfg, const char *name, uint32_t *out) {
    static const struct {
        const char *field;
        uint32_t type;
    } modes[] = {{"pooling_mode_mean_tokens", 1},
                 {"pooling_mode_cls_token", 2},
                 {"pooling_mode_lasttoken", 3},
                 {"pooling_mode_max_tokens", 0},
                 {"pooling_mode_mean_sqrt_len_tokens", 0},
                 {"pooling_mode_weightedmean_tokens", 0}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, modes[i].field);
        if (!cJSON_IsTrue(v))
            continue;
        if (modes[i].type == 0)
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "%s: %s is not supported (mean, CLS and last token are)", name,
                              modes[i].field);
        *out = modes[i].type;
        return LLM_OK;
    }
    return llmi_error(LLM_ERR_BAD_FORMAT, "%s: no pooling_mode_* field is true", name);
}

static llm_status pooling_keys(const char *folder, const char *arch, llmi_gguf_writer *w) {
    bool absent = false;
    cJSON *modules = NULL, *cfg = NULL;
    LLMI_TRY(read_json(folder, "modules.json", &absent, &modules));
    if (absent)
        return LLM_OK;
    llm_status st = cJSON_IsArray(modules)
                        ? LLM_OK
                        : llmi_error(LLM_ERR_BAD_FORMAT, "modules.json: not a JSON array");
    const char *dir = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, modules) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(m, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(m, "path");
        size_t tl = cJSON_IsString(type) ? strlen(type->valuestring) : 0;
        if (tl >= 7 && strcmp(type->valuestring + tl - 7, "Pooling") == 0)
            dir = cJSON_IsString(path) ? path->valuestring : "";
    }
    char name[256];
    if (st == LLM_OK && dir &&
        (!dir[0] || strstr(dir, "..") || dir[0] == '/' ||
         snprintf(name, sizeof name, "%s/config.json", dir) >= (int)sizeof name))
        st = llmi_error(LLM_ERR_BAD_FORMAT, "modules.json: the Pooling module's path is not a "
                                            "folder inside the model's");
    uint32_t type = 0;
    if (st == LLM_OK && dir)
        st = read_json(folder, name, NULL, &cfg);
    if (st == LLM_OK && dir)
        st = pooling_mode(cfg, name, &type);
    if (st == LLM_OK && dir) {
        char key[96];
        snprintf(key, sizeof key, "%s.pooling_type", arch);
        st = llmi_gguf_w_u32(w, key, type);
    }
    cJSON_Delete(modules);
    cJSON_Delete(cfg);
    return st;
}

#ifdef LLMI_TEST_HOOKS
static char *g_test_tokenizer_gguf;

void llmi_hf_test_tokenizer_source(const char *gguf_path) {
    llmi_free(g_test_tokenizer_gguf);
    g_test_tokenizer_gguf = gguf_path ? llmi_strdup(gguf_path) : NULL;
}

static llm_status test_tokenizer_keys(llmi_gguf_writer *w) {
    llmi_gguf *g;
    LLMI_TRY(llmi_gguf_open(g_test_tokenizer_gguf, true, &g));
    llm_status st = LLM_OK;
    for (uint64_t i = 0; i < g->n_kv && st == LLM_OK; i++)
        if (g->kv[i].key.len > 10 && memcmp(g->kv[i].key.ptr, "tokenizer.", 10) == 0)
            st = llmi_gguf_w_copy_kv(w, &g->kv[i]);
    llmi_gguf_close(g);
    return st;
}
#endif

static llm_status tokenizer_keys(const char *folder, const llmi_hf_config *cfg,
                                 llmi_gguf_writer *w) {
#ifdef LLMI_TEST_HOOKS
    if (g_test_tokenizer_gguf)
        return test_tokenizer_keys(w);
#endif
    /* the converter's Llama class: every class mapped to "llama" */
    bool llama = strcmp(cfg->arch, "llama") == 0;
    llmi_hf_vocab_rules rules = {.prefix_from_config = llama,
                                 .no_bos = llama && cfg->n_vocab == 49152};
    return llmi_hf_tokenizer_keys_rules(folder, &rules, w);
}

/* general.name: the folder's last component, as the converter's default. */
static llm_status name_key(const char *folder, llmi_gguf_writer *w) {
    size_t n = strlen(folder);
    while (n > 1 && folder[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && folder[b - 1] != '/')
        b--;
    char *name = llmi_strndup(folder + b, n - b);
    if (!name)
        return llmi_oom("model name");
    llm_status st = llmi_gguf_w_str(w, "general.name", name[0] ? name : "model");
    llmi_free(name);
    return st;
}

/* The files' memory moves to the parts, which the gguf then owns. */
static llm_status hand_over(hf_folder *h, llmi_gguf_parts *parts) {
    for (size_t i = 0; i < h->n_files; i++) {
        llmi_st_file *f = &h->files[i];
        if (f->map) {
            void *m = f->map;
            f->map = NULL;
            LLMI_TRY(llmi_gguf_parts_keep_mapping(parts, m, f->size));
        }
        if (f->buf) {
            void *b = f->buf;
            f->buf = NULL;
            LLMI_TRY(llmi_gguf_parts_keep_buffer(parts, b));
        }
    }
    return LLM_OK;
}

static llm_status open_folder(hf_folder *h, llmi_gguf_writer *w, llmi_gguf_parts *parts) {
    char *json;
    size_t len;
    LLMI_TRY(llmi_hf_read_text(h->folder, "config.json", NULL, &json, &len));
    llmi_hf_config cfg;
    llm_status st = llmi_hf_config_parse(json, len, &cfg);
    llmi_free(json);
    LLMI_TRY(st);
    LLMI_TRY(llmi_hf_config_write(&cfg, w));
    LLMI_TRY(name_key(h->folder, w));

    bool absent = false;
    LLMI_TRY(llmi_hf_read_text(h->folder, "model.safetensors.index.json", &absent, &json, &len));
    if (absent) {
        st = open_single(h);
    } else {
        st = open_index(h, json, len);
        llmi_free(json);
    }
    LLMI_TRY(st);
    uint32_t file_type = 0;
    LLMI_TRY(llmi_hf_map_tensors(&cfg, h->src, h->n_src, parts, &file_type));
    LLMI_TRY(llmi_gguf_w_u32(w, "general.file_type", file_type));
    LLMI_TRY(hand_over(h, parts));
    LLMI_TRY(generation_keys(h->folder, w));
    LLMI_TRY(pooling_keys(h->folder, cfg.arch, w));
    return tokenizer_keys(h->folder, &cfg, w);
}

llm_status llmi_hf_open(const char *folder, bool use_mmap, llmi_gguf **out) {
    if (!out)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_hf_open: out is NULL");
    *out = NULL;
    if (!folder)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "llmi_hf_open: folder is NULL");
    hf_folder h = {.folder = folder, .use_mmap = use_mmap};
    llmi_gguf_writer *w = NULL;
    llmi_gguf_parts *parts = NULL;
    llm_status st = llmi_gguf_writer_create(&w);
    if (st == LLM_OK)
        st = llmi_gguf_parts_create(&parts);
    if (st == LLM_OK)
        st = open_folder(&h, w, parts);
    folder_free(&h);
    if (st == LLM_OK) {
        st = llmi_gguf_parts_finish(parts, w, out);
        parts = NULL;
    }
    llmi_gguf_parts_release(parts);
    llmi_gguf_writer_free(w);
    return st; /* callers prefix the folder's path, as for a GGUF file */
}
