package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"unsafe"
)

// RequestID identifies a request within its session; never 0, never reused.
type RequestID uint64

// Event is one thing that happened to a request during a step (llm_event),
// copied into Go memory.
type Event struct {
	Request RequestID
	Token   Token  // NoToken on a finish-only event
	Text    string // whole UTF-8 characters this event completes; may be empty
	Logprob float32
	// Finish is FinishNone except on the last event of a sample.
	Finish      FinishReason
	Sample      int // which of the request's samples
	TopTokens   []Token
	TopLogprobs []float32
	// Err is set on a last event that ended in failure: the request's
	// status for FinishError, or why a Stream stopped early.
	Err error
}

func copyEvent(e *C.llm_event) Event {
	ev := Event{
		Request: RequestID(e.request),
		Token:   Token(e.token),
		Logprob: float32(e.logprob),
		Finish:  FinishReason(e.finish_reason),
		Sample:  int(e.sample_index),
	}
	if e.text_len > 0 {
		ev.Text = C.GoStringN(e.text, C.int(e.text_len))
	}
	if n := int(e.n_top); n > 0 {
		ev.TopTokens = make([]Token, n)
		copy(ev.TopTokens, unsafe.Slice((*Token)(unsafe.Pointer(e.top_tokens)), n))
		ev.TopLogprobs = make([]float32, n)
		copy(ev.TopLogprobs, unsafe.Slice((*float32)(unsafe.Pointer(e.top_logprobs)), n))
	}
	if ev.Finish == FinishError {
		ev.Err = newError("request", e.status, "the request could not go on")
	}
	return ev
}

// Submit queues a request for prompt and returns its id; its events come
// from Step. opts may be nil. Safe from any goroutine, also while another
// one steps.
func (s *Session) Submit(prompt []Token, opts *RequestOptions) (RequestID, error) {
	return s.c.submit(prompt, opts, nil)
}

// submit queues a request; a non-nil stream is registered for its events
// before any step can route them.
func (c *session) submit(prompt []Token, opts *RequestOptions, stream *streamState) (RequestID, error) {
	var arena cArena
	defer arena.free()
	params, err := arena.requestParams(opts)
	if err != nil {
		return 0, err
	}
	loan := &requestLoan{finishesDue: opts.samples()}
	if opts != nil {
		if params.adapter, err = opts.Adapter.lend(); err != nil {
			return 0, err
		}
		loan.adapter = opts.Adapter
		params.adapter_scale = adapterScale(opts.AdapterScale)
		if _, err := lendSampling(opts.Sampling, params.sampling); err != nil {
			loan.giveBack()
			return 0, err
		}
		loan.grammar = samplingGrammar(opts.Sampling)
	}
	if err := c.acquire(); err != nil {
		loan.giveBack()
		return 0, err
	}
	defer c.mu.RUnlock()
	var cprompt *C.llm_token
	if len(prompt) > 0 {
		cprompt = (*C.llm_token)(unsafe.Pointer(&prompt[0]))
	}
	// Holding routeMu across the submit keeps a concurrent step from
	// routing the request's first events before it is registered.
	c.routeMu.Lock()
	defer c.routeMu.Unlock()
	var id C.llm_request_id
	var msg *C.char
	st := C.shim_session_submit(c.ptr, cprompt, C.size_t(len(prompt)), params, &id, &msg)
	if err := takeError("submit", st, msg); err != nil {
		loan.giveBack()
		return 0, err
	}
	c.holdRequestLoan(RequestID(id), loan)
	if stream != nil {
		stream.id = RequestID(id)
		c.streams[stream.id] = stream
	}
	return RequestID(id), nil
}

// Cancel cancels a request: its KV blocks are freed at once (or when a
// step computing it ends) and a later step reports it finished with
// FinishCancelled. An unknown id, or one whose finish was delivered,
// gives ErrNotFound. Safe from any goroutine.
func (s *Session) Cancel(id RequestID) error {
	c := s.c
	if err := c.acquire(); err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var msg *C.char
	return takeError("cancel", C.shim_session_cancel(c.ptr, C.llm_request_id(id), &msg), msg)
}

// Step runs one scheduler iteration (llm_session_step) and returns the
// events of requests made with Submit; events of Streams go to them. It
// may return no events while requests still run (their events went to
// streams, or a step produced none); watch for each request's finish.
// Steps run one at a time: Step waits while another goroutine steps.
// A failed step changes no request and may be repeated.
func (s *Session) Step() ([]Event, error) {
	c := s.c
	if err := c.takeTurn(context.Background()); err != nil {
		return nil, err
	}
	defer c.endTurn()
	if events := c.takePending(); len(events) > 0 {
		return events, nil
	}
	if _, err := c.stepOnce(); err != nil {
		return nil, err
	}
	return c.takePending(), nil
}

func (c *session) takePending() []Event {
	c.routeMu.Lock()
	defer c.routeMu.Unlock()
	events := c.pending
	c.pending = nil
	return events
}

// stepOnce runs llm_session_step once and routes its events; the caller
// holds the step turn. It returns how many events the step delivered.
func (c *session) stepOnce() (int, error) {
	if err := c.acquire(); err != nil {
		return 0, err
	}
	var n C.size_t
	var msg *C.char
	st := C.shim_session_step(c.ptr, c.events, eventCapacity, &n, &msg)
	if st != C.LLM_OK {
		c.mu.RUnlock()
		return 0, takeError("step", st, msg)
	}
	// Event text is borrowed until the next step: copy it before letting go.
	raw := unsafe.Slice(c.events, int(n))
	events := make([]Event, len(raw))
	for i := range raw {
		events[i] = copyEvent(&raw[i])
	}
	c.mu.RUnlock()
	c.route(events)
	return len(events), nil
}

func (c *session) route(events []Event) {
	c.routeMu.Lock()
	defer c.routeMu.Unlock()
	for _, ev := range events {
		c.releaseFinished(ev)
		if st, ok := c.streams[ev.Request]; ok {
			if st.deliver(ev) {
				delete(c.streams, ev.Request)
			}
			continue
		}
		if due, ok := c.discard[ev.Request]; ok {
			if ev.Finish != FinishNone {
				if due <= 1 {
					delete(c.discard, ev.Request)
				} else {
					c.discard[ev.Request] = due - 1
				}
			}
			continue
		}
		c.pending = append(c.pending, ev)
	}
}

// forget stops routing a stream's request and cancels it in the library,
// whose finish events are then dropped.
func (c *session) forget(st *streamState) {
	if c.acquire() != nil {
		return // Close freed everything already
	}
	defer c.mu.RUnlock()
	c.routeMu.Lock()
	if c.streams[st.id] != st {
		c.routeMu.Unlock()
		return // finished, or never submitted
	}
	delete(c.streams, st.id)
	due := st.finishesDue()
	c.discard[st.id] = due
	c.routeMu.Unlock()
	var msg *C.char
	// ErrNotFound means its finish was delivered meanwhile; nothing to free.
	_ = takeError("cancel", C.shim_session_cancel(c.ptr, C.llm_request_id(st.id), &msg), msg)
}
