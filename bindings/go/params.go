package llminfer

/*
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cArena holds the C memory of one call's params: cgo forbids handing C
// Go memory that itself holds Go pointers, and the params structs point
// at sampling params, stop lists and bias arrays.
type cArena struct{ ptrs []unsafe.Pointer }

func (a *cArena) alloc(size uintptr) unsafe.Pointer {
	p := C.malloc(C.size_t(size)) // cgo's malloc never returns nil
	C.memset(p, 0, C.size_t(size))
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *cArena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

// LogitBias adds Bias to one token's logit; math.Inf(-1) bans the token.
type LogitBias struct {
	Token Token
	Bias  float32
}

// Sampling chooses the next token (llm_sampling_params; llm.h describes
// each step). Start from DefaultSampling(): the zero value is not valid
// (TopP 0). A nil *Sampling wherever one is taken means greedy.
type Sampling struct {
	Temperature      float32 // 0 = greedy
	TopK             int     // 0 = off
	TopP             float32 // 1 = off
	MinP             float32 // 0 = off
	Seed             uint64  // same seed, same tokens
	RepeatPenalty    float32 // 1 = off
	RepeatLastN      int     // -1 = whole history, 0 = no penalties
	PresencePenalty  float32
	FrequencyPenalty float32
	LogitBias        []LogitBias
	MinTokens        int // end-of-generation tokens are banned before this many
	// Grammar constrains the tokens (compiled for the same model); nil:
	// unconstrained. Requests and samplers keep it alive while they run.
	Grammar *Grammar
}

// DefaultSampling returns the library's defaults (temperature 0.8, top-k 40,
// top-p 0.95, min-p 0.05, seed 0).
func DefaultSampling() Sampling {
	var p C.llm_sampling_params
	C.llm_sampling_params_init_sized(&p, C.sizeof_llm_sampling_params)
	return Sampling{
		Temperature:      float32(p.temperature),
		TopK:             int(p.top_k),
		TopP:             float32(p.top_p),
		MinP:             float32(p.min_p),
		Seed:             uint64(p.seed),
		RepeatPenalty:    float32(p.repeat_penalty),
		RepeatLastN:      int(p.repeat_last_n),
		PresencePenalty:  float32(p.presence_penalty),
		FrequencyPenalty: float32(p.frequency_penalty),
		MinTokens:        int(p.min_tokens),
	}
}

func (a *cArena) sampling(s *Sampling) *C.llm_sampling_params {
	if s == nil {
		return nil
	}
	p := (*C.llm_sampling_params)(a.alloc(C.sizeof_llm_sampling_params))
	C.llm_sampling_params_init_sized(p, C.sizeof_llm_sampling_params)
	p.temperature = C.float(s.Temperature)
	p.top_k = C.int32_t(s.TopK)
	p.top_p = C.float(s.TopP)
	p.min_p = C.float(s.MinP)
	p.seed = C.uint64_t(s.Seed)
	p.repeat_penalty = C.float(s.RepeatPenalty)
	p.repeat_last_n = C.int32_t(s.RepeatLastN)
	p.presence_penalty = C.float(s.PresencePenalty)
	p.frequency_penalty = C.float(s.FrequencyPenalty)
	p.min_tokens = C.uint32_t(s.MinTokens)
	if n := len(s.LogitBias); n > 0 {
		biases := unsafe.Slice((*C.llm_logit_bias)(a.alloc(uintptr(n)*C.sizeof_llm_logit_bias)), n)
		for i, b := range s.LogitBias {
			biases[i].token = C.llm_token(b.Token)
			biases[i].bias = C.float(b.Bias)
		}
		p.logit_bias = &biases[0]
		p.n_logit_bias = C.size_t(n)
	}
	return p
}

// SpecMode selects speculative decoding (llm_spec_mode).
type SpecMode uint32

const (
	SpecNone  SpecMode = C.LLM_SPEC_NONE
	SpecNgram SpecMode = C.LLM_SPEC_NGRAM // prompt lookup
	SpecDraft SpecMode = C.LLM_SPEC_DRAFT // the session's draft model
)

// GenerateOptions are the options of Session.Generate; nil or the zero
// value gives the library's defaults (128 new tokens, greedy).
type GenerateOptions struct {
	MaxNewTokens int // 0 = library default
	Sampling     *Sampling
	IgnoreEOS    bool
	Spec         SpecMode
	SpecK        int // drafts per step; 0 = adaptive
	// Adapter runs the generation with a LoRA adapter of the session's
	// model (nil: the base model), at AdapterScale times its alpha / rank
	// (0 means 1; Session.SeqSetAdapter takes any scale).
	Adapter      *Adapter
	AdapterScale float32
}

func (a *cArena) generateParams(o *GenerateOptions) *C.llm_generate_params {
	p := (*C.llm_generate_params)(a.alloc(C.sizeof_llm_generate_params))
	C.llm_generate_params_init_sized(p, C.sizeof_llm_generate_params)
	if o == nil {
		return p
	}
	if o.MaxNewTokens > 0 {
		p.max_new_tokens = C.uint32_t(o.MaxNewTokens)
	}
	p.sampling = a.sampling(o.Sampling)
	p.ignore_eos = C.bool(o.IgnoreEOS)
	p.spec_mode = C.uint32_t(o.Spec)
	p.spec_k = C.uint32_t(o.SpecK)
	return p
}

// RequestOptions are the options of Session.Submit and Session.Stream;
// nil or the zero value gives the library's defaults (256 new tokens,
// greedy, one sample).
type RequestOptions struct {
	MaxNewTokens int // 0 = library default
	Sampling     *Sampling
	Priority     int // higher is admitted first
	IgnoreEOS    bool
	Logprobs     bool     // report each token's log-probability
	TopLogprobs  int      // report this many most likely tokens (at most 20)
	StopTokens   []Token  // generation stops after one of them
	StopStrings  []string // their text is never emitted
	Spec         SpecMode
	SpecK        int
	Samples      int // independent completions; 0 means 1
	// Adapter runs the request with a LoRA adapter of the session's model
	// (nil: the base model), at AdapterScale times its alpha / rank (0
	// means 1). The request keeps the adapter alive until it finishes.
	Adapter      *Adapter
	AdapterScale float32
}

// adapterScale is the scale the library gets: 0 stands for the default 1.
func adapterScale(scale float32) C.float {
	if scale == 0 {
		return 1
	}
	return C.float(scale)
}

func (o *RequestOptions) samples() int {
	if o == nil || o.Samples < 1 {
		return 1
	}
	return o.Samples
}

func (a *cArena) requestParams(o *RequestOptions) (*C.llm_request_params, error) {
	p := (*C.llm_request_params)(a.alloc(C.sizeof_llm_request_params))
	C.llm_request_params_init_sized(p, C.sizeof_llm_request_params)
	if o == nil {
		return p, nil
	}
	if o.MaxNewTokens < 0 || o.TopLogprobs < 0 || o.SpecK < 0 || o.Samples < 0 {
		return nil, &Error{Op: "submit", Status: ErrInvalidArgument, StatusName: ErrInvalidArgument.Name(),
			Message: fmt.Sprintf("negative count in %+v", *o)}
	}
	if o.MaxNewTokens > 0 {
		p.max_new_tokens = C.uint32_t(o.MaxNewTokens)
	}
	p.sampling = a.sampling(o.Sampling)
	p.priority = C.int32_t(o.Priority)
	p.ignore_eos = C.bool(o.IgnoreEOS)
	p.logprobs = C.bool(o.Logprobs)
	p.top_logprobs = C.uint32_t(o.TopLogprobs)
	p.spec_mode = C.uint32_t(o.Spec)
	p.spec_k = C.uint32_t(o.SpecK)
	p.n_samples = C.uint32_t(o.Samples)
	if n := len(o.StopTokens); n > 0 {
		tokens := unsafe.Slice((*C.llm_token)(a.alloc(uintptr(n)*C.sizeof_llm_token)), n)
		for i, t := range o.StopTokens {
			tokens[i] = C.llm_token(t)
		}
		p.stop_tokens = &tokens[0]
		p.n_stop_tokens = C.size_t(n)
	}
	if n := len(o.StopStrings); n > 0 {
		strs := unsafe.Slice((**C.char)(a.alloc(uintptr(n)*unsafe.Sizeof((*C.char)(nil)))), n)
		for i, s := range o.StopStrings {
			cs := C.CString(s)
			a.ptrs = append(a.ptrs, unsafe.Pointer(cs))
			strs[i] = cs
		}
		p.stop_strings = &strs[0]
		p.n_stop_strings = C.size_t(n)
	}
	return p, nil
}
