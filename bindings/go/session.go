package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// KVType is the element type of the cached keys and values (llm_kv_type).
type KVType uint32

const (
	KVF32  KVType = C.LLM_KV_F32
	KVF16  KVType = C.LLM_KV_F16
	KVBF16 KVType = C.LLM_KV_BF16
	// Since libllminfer 1.4: GGUF Q8_0 / Q4_0 blocks of 32 per head row
	// (needs a head_dim that is a multiple of 32; CPU backend only).
	KVQ8_0 KVType = C.LLM_KV_Q8_0
	KVQ4_0 KVType = C.LLM_KV_Q4_0
)

// SessionOptions are the options of NewSession; the zero value gives the
// library's defaults.
type SessionOptions struct {
	Threads            int    // 0 = one per online CPU
	ContextLength      int    // max tokens per sequence; 0 = the model's training context
	MaxBatchTokens     int    // tokens per forward pass; 0 = 512
	KVCacheBytes       uint64 // 0 = a quarter of available memory, at most 2 GiB
	KVType             KVType
	KVBlockSize        int // tokens per KV block; 0 = 16
	DisablePrefixCache bool
	DraftModel         *Model // for SpecDraft; kept open while the session is

	// Where the session runs (experimental, llm_device_params): Device is
	// "cpu" (or ""), "cuda", or "auto" (the first available backend other
	// than the CPU, else the CPU). TensorParallel splits the model across
	// that many ranks (0 or 1: none): CPU threads, or GPUs with "cuda".
	// Devices lists the device ids, TensorParallel of them (nil: 0, or
	// 0 .. TensorParallel-1). A backend that is not available here is an
	// error saying why.
	Device         string
	TensorParallel int
	Devices        []int
}

// eventCapacity is how many events one llm_session_step call may deliver;
// the library keeps the rest for the next call.
const eventCapacity = 64

// Session runs requests on a model: KV memory, threads, a scheduler.
//
// Goroutines: Submit, Cancel, Interrupt, Stats, LastError and Close may be
// called from any goroutine at any time. Step, Generate and Stream.Next
// step the session; the binding lets one of them run at a time and the
// others wait their turn, so several Streams may be read from different
// goroutines at once: whichever steps hands each stream its own events.
type Session struct{ c *session }

// session is the state Streams share; the finalizer sits on the outer
// Session so that the cycle session <-> streamState never holds it.
type session struct {
	model, draft *Model

	// mu is read-held by every call into the library and write-held by
	// Close while it frees the handle.
	mu      sync.RWMutex
	ptr     *C.llm_session
	closing atomic.Bool

	// stepTurn holds one token while a goroutine steps (llm_session_step
	// and llm_generate are one-thread-at-a-time calls).
	stepTurn chan struct{}
	events   *C.llm_event // C array of eventCapacity, used under stepTurn

	// route maps request ids to the streams that read them; discard counts
	// finish events still due for requests whose stream has gone; pending
	// keeps events of requests submitted with Submit until Step returns them.
	routeMu sync.Mutex
	streams map[RequestID]*streamState
	discard map[RequestID]int
	pending []Event
	// requestLoans holds the adapter and grammar of each running request
	// that has one, under routeMu, until its finish events pass through route.
	requestLoans map[RequestID]*requestLoan

	// seqAdapters holds the adapter of each token-level sequence that has
	// one (adapter.go).
	adapterMu   sync.Mutex
	seqAdapters map[SeqID]*Adapter
}

// NewSession creates a session on model. opts may be nil. The model stays
// loaded until the session is closed.
func NewSession(model *Model, opts *SessionOptions) (*Session, error) {
	if opts == nil {
		opts = &SessionOptions{}
	}
	if err := model.acquire(); err != nil {
		return nil, err
	}
	defer model.mu.RUnlock()
	var draftPtr *C.llm_model
	switch opts.DraftModel {
	case nil:
	case model: // read-locking it twice could deadlock against its Close
		draftPtr = model.ptr
	default:
		if err := opts.DraftModel.acquire(); err != nil {
			return nil, err
		}
		defer opts.DraftModel.mu.RUnlock()
		draftPtr = opts.DraftModel.ptr
	}
	var arena cArena
	defer arena.free()
	p := (*C.llm_session_params)(arena.alloc(C.sizeof_llm_session_params))
	C.llm_session_params_init_sized(p, C.sizeof_llm_session_params)
	p.n_threads = C.uint32_t(opts.Threads)
	p.n_ctx = C.uint32_t(opts.ContextLength)
	if opts.MaxBatchTokens > 0 {
		p.max_batch_tokens = C.uint32_t(opts.MaxBatchTokens)
	}
	p.kv_cache_bytes = C.uint64_t(opts.KVCacheBytes)
	p.kv_type = C.llm_kv_type(opts.KVType)
	p.kv_block_size = C.uint32_t(opts.KVBlockSize)
	p.prefix_cache = C.bool(!opts.DisablePrefixCache)
	p.draft_model = draftPtr
	var backend *C.char
	if opts.Device != "" {
		backend = (*C.char)(arena.alloc(uintptr(len(opts.Device) + 1)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(backend)), len(opts.Device)+1), opts.Device+"\x00")
	}
	var devices *C.int32_t
	if len(opts.Devices) > 0 {
		devices = (*C.int32_t)(arena.alloc(uintptr(len(opts.Devices)) * C.sizeof_int32_t))
		ids := unsafe.Slice((*int32)(unsafe.Pointer(devices)), len(opts.Devices))
		for i, d := range opts.Devices {
			ids[i] = int32(d)
		}
	}
	tp := opts.TensorParallel
	if tp < 1 {
		tp = 1
	}
	var ptr *C.llm_session
	var msg *C.char
	st := C.shim_session_create(model.ptr, p, backend, C.uint32_t(tp), devices,
		C.uint32_t(len(opts.Devices)), &ptr, &msg)
	if err := takeError("create session", st, msg); err != nil {
		return nil, err
	}
	c := &session{
		model:    model,
		draft:    opts.DraftModel,
		ptr:      ptr,
		stepTurn: make(chan struct{}, 1),
		events:   (*C.llm_event)(C.malloc(C.size_t(eventCapacity * C.sizeof_llm_event))),
		streams:  map[RequestID]*streamState{},
		discard:  map[RequestID]int{},

		requestLoans: map[RequestID]*requestLoan{},
		seqAdapters:  map[SeqID]*Adapter{},
	}
	// The session borrows the models: count it so that their Close waits.
	for _, m := range []*Model{c.model, c.draft} {
		if m != nil {
			m.sessions.Add(1)
		}
	}
	s := &Session{c: c}
	runtime.SetFinalizer(s, (*Session).Close)
	return s, nil
}

// Close frees the session. Calls running on other goroutines are
// interrupted and return soon (Generate and Step with ErrCancelled, open
// Streams with ErrClosed); later calls return ErrClosed. Calling Close
// again does nothing.
func (s *Session) Close() error {
	c := s.c
	if !c.closing.CompareAndSwap(false, true) {
		return nil
	}
	runtime.SetFinalizer(s, nil)
	// A call may be on its way into the library, where it would clear a
	// single interrupt; repeat it until every call has left.
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			C.llm_session_interrupt(c.ptr)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	c.mu.Lock()
	close(stop)
	<-stopped
	C.llm_session_free(c.ptr)
	c.ptr = nil
	C.free(unsafe.Pointer(c.events))
	c.events = nil
	c.mu.Unlock()

	c.routeMu.Lock()
	streams := c.streams
	c.streams, c.discard, c.pending = map[RequestID]*streamState{}, map[RequestID]int{}, nil
	c.routeMu.Unlock()
	for _, st := range streams {
		st.end(ErrClosed)
	}
	c.releaseAllAdapters()
	for _, m := range []*Model{c.model, c.draft} {
		if m != nil {
			m.releaseSession()
		}
	}
	return nil
}

func (m *Model) releaseSession() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessions.Add(-1)
	m.freeIfUnusedLocked()
}

// acquire read-locks the session for one call; release with c.mu.RUnlock.
func (c *session) acquire() error {
	c.mu.RLock()
	if c.closing.Load() {
		c.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// takeTurn waits for the right to step, or for ctx to end.
func (c *session) takeTurn(ctx context.Context) error {
	select {
	case c.stepTurn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *session) endTurn() { <-c.stepTurn }

// Interrupt stops the Generate or step now running on the session: it
// returns ErrCancelled soon, having changed no request. It has no effect
// when none runs. Safe from any goroutine.
func (s *Session) Interrupt() {
	c := s.c
	if c.acquire() != nil {
		return
	}
	defer c.mu.RUnlock()
	C.llm_session_interrupt(c.ptr)
}

// Stats are the counters and gauges of a session (llm_session_stats).
type Stats struct {
	Running, Waiting                                  int
	BlockSize                                         int
	BlocksTotal, BlocksUsed, BlocksCached, BlocksFree int
	KVTokensUsed, PrefixHitTokens                     uint64
	PromptTokens, GeneratedTokens                     uint64
	Preemptions, Steps                                uint64
	SpecSteps, SpecDraftTokens, SpecAcceptedTokens    uint64
}

// Stats reads the session's counters. Safe from any goroutine.
func (s *Session) Stats() (Stats, error) {
	c := s.c
	if err := c.acquire(); err != nil {
		return Stats{}, err
	}
	defer c.mu.RUnlock()
	var st C.llm_session_stats
	st.struct_size = C.uint32_t(C.sizeof_llm_session_stats)
	var msg *C.char
	if err := takeError("session stats", C.shim_session_get_stats(c.ptr, &st, &msg), msg); err != nil {
		return Stats{}, err
	}
	return Stats{
		Running: int(st.n_running), Waiting: int(st.n_waiting),
		BlockSize:   int(st.block_size),
		BlocksTotal: int(st.blocks_total), BlocksUsed: int(st.blocks_used),
		BlocksCached: int(st.blocks_cached), BlocksFree: int(st.blocks_free),
		KVTokensUsed: uint64(st.kv_tokens_used), PrefixHitTokens: uint64(st.prefix_hit_tokens),
		PromptTokens: uint64(st.prompt_tokens), GeneratedTokens: uint64(st.generated_tokens),
		Preemptions: uint64(st.preemptions), Steps: uint64(st.steps),
		SpecSteps: uint64(st.spec_steps), SpecDraftTokens: uint64(st.spec_draft_tokens),
		SpecAcceptedTokens: uint64(st.spec_accepted_tokens),
	}, nil
}

// LastError is the session's last failure from any goroutine
// (llm_session_last_error), nil when none failed yet. Calls failing at
// the same time overwrite each other's; every method already returns its
// own call's message, so this is for diagnostics.
func (s *Session) LastError() error {
	c := s.c
	if err := c.acquire(); err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var status C.llm_status
	var msg *C.char
	if st := C.shim_session_last_error(c.ptr, &status, &msg); st != C.LLM_OK {
		return newError("session last error", st, "")
	}
	text := C.GoString(msg)
	C.free(unsafe.Pointer(msg))
	if status == C.LLM_OK {
		return nil
	}
	return newError("session", status, text)
}

// FinishReason is why generation ended (llm_finish_reason).
type FinishReason uint32

const (
	FinishNone      FinishReason = C.LLM_FINISH_NONE
	FinishEOS       FinishReason = C.LLM_FINISH_EOS
	FinishLength    FinishReason = C.LLM_FINISH_LENGTH
	FinishStop      FinishReason = C.LLM_FINISH_STOP
	FinishCancelled FinishReason = C.LLM_FINISH_CANCELLED
	FinishError     FinishReason = C.LLM_FINISH_ERROR
)

func (f FinishReason) String() string {
	switch f {
	case FinishNone:
		return "none"
	case FinishEOS:
		return "eos"
	case FinishLength:
		return "length"
	case FinishStop:
		return "stop"
	case FinishCancelled:
		return "cancelled"
	case FinishError:
		return "error"
	}
	return fmt.Sprintf("FinishReason(%d)", uint32(f))
}

// CancelledError is what a call stopped by its context returns: it
// matches both the context's error and ErrCancelled with errors.Is.
type CancelledError struct {
	Op    string
	Cause error // ctx.Err()
}

func (e *CancelledError) Error() string {
	return fmt.Sprintf("llminfer: %s: %v", e.Op, e.Cause)
}
func (e *CancelledError) Unwrap() error        { return e.Cause }
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// Generation is what Generate produced.
type Generation struct {
	Tokens                         []Token
	Text                           string
	Finish                         FinishReason
	PromptTokens, GeneratedTokens  int
	PromptSeconds, GenerateSeconds float64
	SpecSteps, DraftTokens         int
	AcceptedTokens                 int
}

// Generate continues prompt and returns the whole continuation
// (llm_generate). Each call starts from an empty context. Cancelling ctx
// interrupts it (llm_session_interrupt): it returns soon with the tokens
// so far and a *CancelledError. Requests submitted to the session advance
// in the same steps and keep their events for Step and their Streams.
func (s *Session) Generate(ctx context.Context, prompt []Token, opts *GenerateOptions) (*Generation, error) {
	c := s.c
	if err := ctx.Err(); err != nil {
		return nil, &CancelledError{"generate", err}
	}
	if err := c.takeTurn(ctx); err != nil {
		return nil, &CancelledError{"generate", err}
	}
	defer c.endTurn()
	if err := c.acquire(); err != nil {
		return nil, err
	}
	defer c.mu.RUnlock()

	var arena cArena
	defer arena.free()
	params := arena.generateParams(opts)
	if opts != nil && opts.Adapter != nil {
		// Borrowed by the library for this call only.
		handle, err := opts.Adapter.lend()
		if err != nil {
			return nil, err
		}
		defer opts.Adapter.giveBack()
		params.adapter = handle
		params.adapter_scale = adapterScale(opts.AdapterScale)
	}
	if opts != nil {
		release, err := lendSampling(opts.Sampling, params.sampling)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	var cprompt *C.llm_token
	if len(prompt) > 0 {
		cprompt = (*C.llm_token)(unsafe.Pointer(&prompt[0]))
	}
	var out C.shim_generation
	defer C.shim_generation_free(&out)
	var result C.llm_generate_result
	result.struct_size = C.uint32_t(C.sizeof_llm_generate_result)

	// An interrupt sent before llm_generate starts would be cleared by
	// it, so the watcher repeats it until the call returns.
	done, watcherDone := make(chan struct{}), make(chan struct{})
	ptr := c.ptr
	go func() {
		defer close(watcherDone)
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			C.llm_session_interrupt(ptr)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	var msg *C.char
	st := C.shim_generate(c.ptr, cprompt, C.size_t(len(prompt)), params, &out, &result, &msg)
	close(done)
	<-watcherDone

	gen := &Generation{
		Finish:          FinishReason(result.finish_reason),
		PromptTokens:    int(result.n_prompt_tokens),
		GeneratedTokens: int(result.n_generated_tokens),
		PromptSeconds:   float64(result.prompt_seconds),
		GenerateSeconds: float64(result.generate_seconds),
		SpecSteps:       int(result.n_spec_steps),
		DraftTokens:     int(result.n_draft_tokens),
		AcceptedTokens:  int(result.n_accepted_tokens),
	}
	if out.n_tokens > 0 {
		gen.Tokens = make([]Token, int(out.n_tokens))
		copy(gen.Tokens, unsafe.Slice((*Token)(unsafe.Pointer(out.tokens)), int(out.n_tokens)))
	}
	if out.text_len > 0 {
		gen.Text = C.GoStringN(out.text, C.int(out.text_len))
	}
	err := takeError("generate", st, msg)
	if err != nil && errors.Is(err, ErrCancelled) {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = &CancelledError{"generate", ctxErr}
		}
	}
	return gen, err
}
