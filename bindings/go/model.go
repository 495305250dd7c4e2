package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Model is a loaded GGUF model: weights, hyper-parameters and tokenizer.
// It is immutable, and every method is safe to call from any number of
// goroutines at once, also while sessions use it.
//
// Close frees it. Sessions keep their model alive: a model closed while
// sessions are open refuses new work at once and is freed when the last
// of them closes.
type Model struct {
	mu     sync.RWMutex // read-held by every call into the library
	ptr    *C.llm_model
	closed bool
	// sessions counts open sessions borrowing ptr: added under a read
	// lock (which excludes Close), removed under the write lock.
	sessions atomic.Int32
}

// LoadOptions are the options of LoadModel; the zero value gives the defaults.
type LoadOptions struct {
	// NoMmap reads the file into memory instead of mapping it.
	NoMmap bool
}

// LoadModel loads a GGUF file. A missing or unreadable file gives an
// *Error with ErrIO, a malformed one ErrBadFormat, an unsupported one
// ErrUnsupported. opts may be nil.
func LoadModel(path string, opts *LoadOptions) (*Model, error) {
	if err := checkLibrary(); err != nil {
		return nil, err
	}
	useMmap := C.int(1)
	if opts != nil && opts.NoMmap {
		useMmap = 0
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.llm_model
	var msg *C.char
	st := C.shim_model_load(cpath, useMmap, &ptr, &msg)
	if err := takeError("load model "+path, st, msg); err != nil {
		return nil, err
	}
	m := &Model{ptr: ptr}
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Close frees the model (once its sessions are closed). Calling it again
// does nothing.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	runtime.SetFinalizer(m, nil)
	m.freeIfUnusedLocked()
	return nil
}

func (m *Model) freeIfUnusedLocked() {
	if m.closed && m.sessions.Load() == 0 && m.ptr != nil {
		C.llm_model_free(m.ptr)
		m.ptr = nil
	}
}

// acquire read-locks the model for one call; release with m.mu.RUnlock.
func (m *Model) acquire() error {
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// ModelInfo describes a loaded model.
type ModelInfo struct {
	Architecture    string
	Name            string
	Params          uint64 // number of weights
	WeightBytes     uint64
	Layers          int
	Embedding       int
	Heads           int
	KVHeads         int
	FeedForward     int
	Vocab           int
	ContextTrain    int   // context length the model was trained for
	BOS, EOS, EOT   Token // NoToken when absent
	Pad             Token
	HasChatTemplate bool
}

// Info returns facts about the model.
func (m *Model) Info() (ModelInfo, error) {
	if err := m.acquire(); err != nil {
		return ModelInfo{}, err
	}
	defer m.mu.RUnlock()
	var info C.llm_model_info
	info.struct_size = C.uint32_t(C.sizeof_llm_model_info)
	var msg *C.char
	st := C.shim_model_get_info(m.ptr, &info, &msg)
	if err := takeError("model info", st, msg); err != nil {
		return ModelInfo{}, err
	}
	return ModelInfo{
		Architecture:    C.GoString(info.architecture),
		Name:            C.GoString(info.name),
		Params:          uint64(info.n_params),
		WeightBytes:     uint64(info.weight_bytes),
		Layers:          int(info.n_layers),
		Embedding:       int(info.n_embd),
		Heads:           int(info.n_heads),
		KVHeads:         int(info.n_kv_heads),
		FeedForward:     int(info.n_ff),
		Vocab:           int(info.n_vocab),
		ContextTrain:    int(info.n_ctx_train),
		BOS:             Token(info.bos),
		EOS:             Token(info.eos),
		EOT:             Token(info.eot),
		Pad:             Token(info.pad),
		HasChatTemplate: bool(info.has_chat_template),
	}, nil
}

// TokenizeFlags are the flags of Tokenize (llm_tokenize_flag).
type TokenizeFlags uint32

const (
	// AddSpecial adds the model's BOS token (and EOS where the model asks for it).
	AddSpecial TokenizeFlags = C.LLM_TOKENIZE_ADD_SPECIAL
	// ParseSpecial turns special-token text such as "<|im_start|>" into its token.
	ParseSpecial TokenizeFlags = C.LLM_TOKENIZE_PARSE_SPECIAL
	// Strict refuses text with a byte the vocabulary has no token for.
	Strict TokenizeFlags = C.LLM_TOKENIZE_STRICT
)

// DetokenizeFlags are the flags of Detokenize (llm_detokenize_flag).
type DetokenizeFlags uint32

// RenderSpecial renders control tokens ("<|im_end|>") as text instead of skipping them.
const RenderSpecial DetokenizeFlags = C.LLM_DETOKENIZE_SPECIAL

// The library reports the size it needs; a second call with that size
// succeeds, so a third attempt only covers a size that changed meanwhile.
const sizeRetries = 3

// Tokenize turns UTF-8 text into tokens. Invalid UTF-8 gives ErrInvalidUTF8.
func (m *Model) Tokenize(text string, flags TokenizeFlags) ([]Token, error) {
	if err := m.acquire(); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	capacity := len(text) + 8
	for attempt := 0; ; attempt++ {
		tokens := make([]Token, capacity)
		var n C.size_t
		var msg *C.char
		st := C.shim_tokenize(m.ptr, ctext, C.size_t(len(text)), C.uint32_t(flags),
			(*C.llm_token)(unsafe.Pointer(&tokens[0])), C.size_t(capacity), &n, &msg)
		if st == C.LLM_ERR_BUFFER_TOO_SMALL && attempt < sizeRetries {
			capacity = int(n)
			continue
		}
		if err := takeError("tokenize", st, msg); err != nil {
			return nil, err
		}
		return tokens[:int(n)], nil
	}
}

// Detokenize turns tokens back into text; byte sequences that are not
// valid UTF-8 become U+FFFD.
func (m *Model) Detokenize(tokens []Token, flags DetokenizeFlags) (string, error) {
	if err := m.acquire(); err != nil {
		return "", err
	}
	defer m.mu.RUnlock()
	var ctokens *C.llm_token
	if len(tokens) > 0 {
		ctokens = (*C.llm_token)(unsafe.Pointer(&tokens[0]))
	}
	capacity := 8*len(tokens) + 16
	for attempt := 0; ; attempt++ {
		buf := make([]byte, capacity)
		var n C.size_t
		var msg *C.char
		st := C.shim_detokenize(m.ptr, ctokens, C.size_t(len(tokens)), C.uint32_t(flags),
			(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(capacity), &n, &msg)
		if st == C.LLM_ERR_BUFFER_TOO_SMALL && attempt < sizeRetries {
			capacity = int(n)
			continue
		}
		if err := takeError("detokenize", st, msg); err != nil {
			return "", err
		}
		return string(buf[:int(n)]), nil
	}
}

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role    string // "system", "user", "assistant"
	Content string
}

// ApplyChatTemplate renders messages with the model's own chat template.
// With addGenerationPrompt the text ends where the assistant's reply
// starts. A model without a recognised template gives ErrUnsupported.
// Tokenize the result with ParseSpecial (and AddSpecial).
func (m *Model) ApplyChatTemplate(messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	if err := m.acquire(); err != nil {
		return "", err
	}
	defer m.mu.RUnlock()
	// The strings live in C memory: cgo forbids passing Go memory that
	// holds Go pointers.
	n := len(messages)
	arrays := C.calloc(C.size_t(2*n+1), C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(arrays)
	strs := unsafe.Slice((**C.char)(arrays), 2*n+1)
	total := 0
	for i, msg := range messages {
		strs[i] = C.CString(msg.Role)
		strs[n+i] = C.CString(msg.Content)
		total += len(msg.Role) + len(msg.Content) + 32
	}
	defer func() {
		for _, s := range strs {
			C.free(unsafe.Pointer(s))
		}
	}()
	gen := C.int(0)
	if addGenerationPrompt {
		gen = 1
	}
	capacity := total + 64
	for attempt := 0; ; attempt++ {
		buf := make([]byte, capacity)
		var size C.size_t
		var msg *C.char
		st := C.shim_chat_template_apply(m.ptr, &strs[0], &strs[n], C.size_t(n), gen,
			(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(capacity), &size, &msg)
		if st == C.LLM_ERR_BUFFER_TOO_SMALL && attempt < sizeRetries {
			capacity = int(size)
			continue
		}
		if err := takeError("apply chat template", st, msg); err != nil {
			return "", err
		}
		return string(buf[:int(size)]), nil
	}
}
