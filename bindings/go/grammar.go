package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Grammar constrains generation to the strings it accepts (API 1.3;
// docs/structured-output.md): a JSON Schema, a GBNF grammar or a regular
// expression, compiled for one model's vocabulary. Put it in
// Sampling.Grammar for Generate, requests and samplers: only tokens the
// grammar allows next are sampled, and generation ends (FinishStop) when
// the grammar can go no further. It is immutable: any number of requests
// and samplers may use it at once, from any goroutine.
//
// Like an Adapter, a grammar is kept alive while the library borrows it:
// Close marks it closed at once (new requests and samplers naming it get
// ErrClosed) and frees it when the last request or sampler using it has
// ended. A grammar keeps its model loaded until it is freed.
type Grammar struct {
	lendable
	ptr   *C.llm_grammar
	model *Model
}

// GrammarWhitespace is the whitespace a JSON-Schema grammar allows
// between JSON tokens (llm_grammar_whitespace).
type GrammarWhitespace uint32

const (
	WhitespaceCompact  GrammarWhitespace = 0 // none: {"a":1,"b":[true]}
	WhitespaceFlexible GrammarWhitespace = 1 // optional spaces, newlines and indentation
)

// GrammarOptions are the compile options; the zero value gives the defaults.
type GrammarOptions struct {
	Whitespace GrammarWhitespace // JSON Schemas
	Root       string            // GBNF: the start rule; "" means "root"
}

// CompileJSONSchema compiles a JSON Schema (llm_grammar_compile_json_schema;
// llm.h lists the keywords). An unsupported keyword gives an *Error with
// ErrUnsupported, malformed JSON ErrInvalidArgument; the message gives the
// JSON pointer. opts may be nil.
func CompileJSONSchema(model *Model, schema string, opts *GrammarOptions) (*Grammar, error) {
	return compileGrammar(0, "compile JSON schema", model, schema, opts)
}

// CompileEBNF compiles a grammar in GBNF notation (llm_grammar_compile_ebnf);
// errors give the line:column. opts may be nil.
func CompileEBNF(model *Model, text string, opts *GrammarOptions) (*Grammar, error) {
	return compileGrammar(1, "compile EBNF grammar", model, text, opts)
}

// CompileRegex compiles a regular expression that the whole output must
// match (llm_grammar_compile_regex). opts may be nil.
func CompileRegex(model *Model, regex string, opts *GrammarOptions) (*Grammar, error) {
	return compileGrammar(2, "compile regex", model, regex, opts)
}

func compileGrammar(kind C.int, op string, model *Model, text string, opts *GrammarOptions) (*Grammar, error) {
	if opts == nil {
		opts = &GrammarOptions{}
	}
	if err := model.acquire(); err != nil {
		return nil, err
	}
	defer model.mu.RUnlock()
	ctext := C.CString(text) // passed with its length: a NUL inside is the compiler's to judge
	defer C.free(unsafe.Pointer(ctext))
	var root *C.char
	if opts.Root != "" {
		root = C.CString(opts.Root)
		defer C.free(unsafe.Pointer(root))
	}
	var ptr *C.llm_grammar
	var msg *C.char
	st := C.shim_grammar_compile(kind, model.ptr, ctext, C.size_t(len(text)),
		C.uint32_t(opts.Whitespace), root, &ptr, &msg)
	if err := takeError(op, st, msg); err != nil {
		return nil, err
	}
	model.sessions.Add(1) // as an adapter: the model's Close waits for it
	g := &Grammar{ptr: ptr, model: model}
	g.free = func() {
		C.shim_grammar_free(g.ptr)
		g.ptr = nil
		model.releaseSession()
	}
	runtime.SetFinalizer(g, (*Grammar).Close)
	return g, nil
}

// Close frees the grammar, or marks it closed and frees it once no request
// or sampler uses it any more. Calling it again does nothing.
func (g *Grammar) Close() error {
	runtime.SetFinalizer(g, nil)
	g.close()
	return nil
}

// InUse reports how many requests, generations and samplers the library
// is lending the grammar to now.
func (g *Grammar) InUse() int { return g.inUse() }

// lend counts one more use by the library and returns the handle; a
// closed grammar gives ErrClosed, a nil one lends nothing.
func (g *Grammar) lend() (*C.llm_grammar, error) {
	if g == nil {
		return nil, nil
	}
	if err := g.lendable.lend(); err != nil {
		return nil, err
	}
	return g.ptr, nil
}

func (g *Grammar) giveBack() {
	if g != nil {
		g.lendable.giveBack()
	}
}

// samplingGrammar is the grammar of s (nil for none).
func samplingGrammar(s *Sampling) *Grammar {
	if s == nil {
		return nil
	}
	return s.Grammar
}

// lendSampling lends the grammar of s, if any, and points the C params
// (built from s) at it; release gives it back.
func lendSampling(s *Sampling, p *C.llm_sampling_params) (release func(), err error) {
	g := samplingGrammar(s)
	handle, err := g.lend()
	if err != nil {
		return nil, err
	}
	if p != nil {
		p.grammar = handle
	}
	return g.giveBack, nil
}
