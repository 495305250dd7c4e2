/* Internals of the Jinja interpreter shared by its files: the arena every
 * render allocates from, values, tokens, the syntax tree, the render
 * context. Not a module interface: only lib/jinja/ includes it. */
#ifndef LLMI_JINJA_IMPL_H
#define LLMI_JINJA_IMPL_H

#include "jinja/jinja.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* --- arena: everything of one render, freed at once -------------------- */
typedef struct jx_chunk jx_chunk;
typedef struct jx_arena {
    jx_chunk *head;
    size_t used, limit;
} jx_arena;

/* --- values ------------------------------------------------------------ */
typedef enum jv_kind {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_FUNC,
} jv_kind;

typedef struct jstr {
    size_t n;
    char s[]; /* n bytes and a NUL */
} jstr;

typedef struct jv {
    jv_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        struct jlist *l;
        struct jdict *d;
        struct jfunc *fn;
        const char *undef; /* the name that was looked up, for messages */
    } u;
} jv;

typedef struct jlist {
    size_t n, cap;
    bool tuple;
    jv *v;
} jlist;

typedef struct jdict {
    size_t n, cap;
    bool ns; /* namespace(): its attributes may be set */
    jv *k, *v;
} jdict;

struct node;
struct frame;
struct jctx;
typedef llm_status (*jx_builtin)(struct jctx *c, jv self, const jv *args, size_t n,
                                 const char *const *kwn, const jv *kwv, size_t nkw, jv *out);

typedef struct jfunc {
    const char *name;
    jx_builtin fn;            /* a builtin (a global or a bound method) ... */
    jv self;                  /* ... and the value it is bound to */
    const struct node *macro; /* or a macro (or a call block's caller) */
    struct frame *closure;
    jv caller; /* the caller() a {% call %} passes to its macro */
} jfunc;

/* --- tokens -------------------------------------------------------------- */
typedef enum tok_kind {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
} tok_kind;

typedef struct token {
    tok_kind k;
    uint32_t line, col;
    const char *s; /* text, name, decoded string or operator */
    size_t n;
    int64_t i;
    double f;
} token;

/* --- syntax tree --------------------------------------------------------- */
typedef enum node_kind {
    /* statements */
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SET_BLOCK,
    N_MACRO,
    N_CALL_BLOCK,
    N_FILTER_BLOCK,
    N_BREAK,
    N_CONTINUE,
    N_BODY,
    /* expressions */
    N_LIT,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_BINOP,
    N_NEG,
    N_POS,
    N_NOT,
    N_AND,
    N_OR,
    N_COND,
    N_COMPARE,
    N_CONCAT,
} node_kind;

typedef struct node {
    node_kind k;
    uint32_t line, col;
    int op;                 /* operator (N_BINOP, N_COMPARE items), negation (N_TEST) */
    const char *name;       /* identifier, attribute, filter/test/macro name */
    struct node *a, *b, *c; /* operands, conditions, targets */
    struct node **kids;     /* bodies, arguments, list items, dict keys */
    size_t n;
    struct node **kids2; /* else bodies, keyword values, dict values, defaults */
    size_t n2;
    const char **names; /* keyword names, macro parameters, loop targets */
    size_t n_names;
    int *ops; /* N_COMPARE: one operator per kid after the first */
    jv lit;
} node;

/* operators */
enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
};

/* --- render context ------------------------------------------------------- */
typedef struct frame {
    struct frame *parent;
    jdict *vars;
} frame;

typedef struct jbuf {
    char *s;
    size_t n, cap;
} jbuf;

typedef struct jctx {
    jx_arena arena;
    llmi_jinja_limits lim;
    uint64_t steps, loops;
    uint32_t depth;      /* macro calls in progress */
    uint32_t eval_depth; /* nested evaluations in progress (the C stack's depth) */
    double now;
    frame *globals;
    jbuf *out;
    int loop_ctl; /* 1: break, 2: continue, pending */
    const char *src;
    size_t src_len;
} jctx;

/* arena.c / value.c */
void *jx_alloc(jctx *c, size_t n);
void jx_arena_free(jx_arena *a);
llm_status jx_oom(jctx *c);
jstr *jx_str(jctx *c, const char *s, size_t n);
jv jv_str(jstr *s);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_bool(bool b);
jv jv_none(void);
jv jv_undef(const char *name);
llm_status jv_cstr(jctx *c, const char *s, size_t n, jv *out);
llm_status jx_list_new(jctx *c, size_t cap, jlist **out);
llm_status jx_list_push(jctx *c, jlist *l, jv v);
llm_status jx_dict_new(jctx *c, size_t cap, jdict **out);
llm_status jx_dict_set(jctx *c, jdict *d, jv k, jv v);
bool jx_dict_get(const jdict *d, jv k, jv *out);
bool jx_dict_get_str(const jdict *d, const char *key, jv *out);
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
const char *jv_type_name(jv v);
/* str() into a buffer; repr() when `repr` */
llm_status jb_put(jctx *c, jbuf *b, const char *s, size_t n);
static inline llm_status jb_puts(jctx *c, jbuf *b, const char *s) {
    return jb_put(c, b, s, strlen(s));
}
llm_status jv_write(jctx *c, jbuf *b, jv v, bool repr);
llm_status jv_to_str(jctx *c, jv v, jv *out); /* str(v) as a string value */
/* json.dumps's formatting: indent < 0 for None; the separators between
 * items and between a key and its value */
typedef struct jx_json_fmt {
    int indent;
    bool sort_keys;
    const jstr *item_sep, *key_sep; /* NULL: json.dumps's defaults */
} jx_json_fmt;
llm_status jv_tojson(jctx *c, jbuf *b, jv v, const jx_json_fmt *fmt, int level); /* tojson.c */
llm_status jv_from_json(jctx *c, const struct cJSON *j, int depth, jv *out);
size_t jx_utf8_count(const char *s, size_t n);
size_t jx_utf8_offset(const char *s, size_t n, size_t chars); /* byte offset of a character */
void jx_float_repr(double f, char *buf, size_t cap);
llm_status jx_fail(jctx *c, const node *at, const char *fmt, ...) LLMI_PRINTF(3, 4);

/* lex.c */
llm_status jx_lex(jctx *c, token **toks, size_t *n);

/* parse.c: the parser's state and helpers parse_stmt.c shares */
typedef struct parser {
    jctx *c;
    const token *t;
    size_t n, i;
    uint32_t depth;
} parser;

/* a growable array of node pointers in the arena */
typedef struct nvec {
    node **v;
    size_t n, cap;
} nvec;

typedef struct svec {
    const char **v;
    size_t n, cap;
} svec;

llm_status jp_nv_push(parser *p, nvec *a, node *x);
llm_status jp_sv_push(parser *p, svec *a, const char *s);
const token *jp_cur(const parser *p);
bool jp_is_op(const token *t, const char *op);
bool jp_is_name(const token *t, const char *name);
bool jp_skip_op(parser *p, const char *op);
bool jp_skip_name(parser *p, const char *name);
llm_status jp_expect_op(parser *p, const char *op);
llm_status jp_expect_kind(parser *p, tok_kind k, const char *what);
llm_status jp_new_node(parser *p, node_kind k, const token *at, node **out);
llm_status jp_fail_at(const parser *p, const token *t, const char *fmt, const char *arg);
llm_status jp_unexpected(const parser *p);
llm_status jp_enter(parser *p);
llm_status jp_expr(parser *p, bool condexpr, node **out);
llm_status jp_tuple(parser *p, bool condexpr, node **out);
llm_status jp_call_args(parser *p, node *call);
llm_status jx_parse(jctx *c, const token *toks, size_t n, node **root);

/* eval.c: operators, lookups, subscripts */
jv jx_undef(jctx *c, const char *fmt, ...) LLMI_PRINTF(2, 3);
llm_status jx_undefined_error(jctx *c, const node *at, jv v);
llm_status jx_step(jctx *c, const node *at);
llm_status jx_frame_set(jctx *c, frame *f, const char *name, jv v);
llm_status jx_lookup(jctx *c, frame *f, const char *name, jv *out);
llm_status jx_binop(jctx *c, const node *at, int op, jv a, jv b, jv *out);
llm_status jx_get_item(jctx *c, const node *at, jv obj, jv key, jv *out);
llm_status jx_eval_slice(jctx *c, frame *f, const node *e, jv *out);
llm_status jx_format_percent(jctx *c, const node *at, jv fmt, jv args, jv *out);
/* exec.c */
llm_status jx_eval(jctx *c, frame *f, const node *e, jv *out);
llm_status jx_exec_body(jctx *c, frame *f, const node *body);
llm_status jx_call(jctx *c, const node *at, jv fn, const jv *args, size_t n, const char *const *kwn,
                   const jv *kwv, size_t nkw, jv *out);
llm_status jx_frame_new(jctx *c, frame *parent, frame **out);
llm_status jx_compare(jctx *c, const node *at, int op, jv a, jv b, bool *out);

/* strings.c */
bool jx_py_space(uint32_t cp);
llm_status jx_strip(jctx *c, const jstr *s, const jstr *chars, int which, jv *out);
llm_status jx_split(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, bool right, jv *out);
llm_status jx_case(jctx *c, const jstr *s, int mode, jv *out);
llm_status jx_replace(jctx *c, const jstr *s, const jstr *old, const jstr *rep, int64_t count,
                      jv *out);
bool jx_starts(const jstr *s, const jstr *p);
bool jx_ends(const jstr *s, const jstr *p);

/* filters.c */
llm_status jx_filter(jctx *c, const node *at, const char *name, jv v, const jv *args, size_t n,
                     const char *const *kwn, const jv *kwv, size_t nkw, jv *out);
bool jx_filter_known(const char *name);
llm_status jx_test(jctx *c, const node *at, const char *name, jv v, const jv *args, size_t n,
                   bool *out);
bool jx_test_known(const char *name);
/* methods.c */
llm_status jx_getattr(jctx *c, const node *at, jv obj, const char *name, jv *out);
llm_status jx_global(jctx *c, const char *name, jv *out);

#endif
