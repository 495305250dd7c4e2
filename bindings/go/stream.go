package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
)

// idleError is nil unless the session has no request left: then a stream
// still waiting for its finish would wait forever, and ends instead.
func (c *session) idleError() error {
	if err := c.acquire(); err != nil {
		return err
	}
	defer c.mu.RUnlock()
	var stats C.llm_session_stats
	stats.struct_size = C.uint32_t(C.sizeof_llm_session_stats)
	var msg *C.char
	if err := takeError("session stats", C.shim_session_get_stats(c.ptr, &stats, &msg), msg); err != nil {
		return err
	}
	if stats.n_running == 0 && stats.n_waiting == 0 {
		return newError("stream", C.LLM_ERR_INTERNAL, "the session is idle but the request never finished")
	}
	return nil
}

// Stream reads one request's tokens as they are generated:
//
//	stream, err := session.Stream(ctx, prompt, nil)
//	if err != nil { ... }
//	defer stream.Close()
//	for stream.Next() {
//		fmt.Print(stream.Token().Text)
//	}
//	if err := stream.Err(); err != nil { ... }
//
// Next steps the session itself when its own events have not come yet, so
// no other goroutine needs to drive it; Streams of one session may be read
// from different goroutines at once. One Stream is read by one goroutine;
// Close may be called from any.
//
// Cancelling the Stream's context cancels the request at once (its KV
// blocks are freed) and Next returns false with a *CancelledError.
type Stream struct {
	st      *streamState
	current Event
}

// streamState is what the session's router and the context watcher share
// with the Stream; it never points back at the Stream, so an abandoned
// Stream is finalized (and its request cancelled).
type streamState struct {
	c       *session
	ctx     context.Context
	id      RequestID
	samples int

	mu       sync.Mutex
	queue    []Event
	finishes int
	finish   FinishReason
	err      error
	done     bool          // every finish event came, or the stream was ended
	doneCh   chan struct{} // closed with done
}

// deliver queues an event of this request; it reports whether the
// request is over (the router then forgets it). Called under routeMu.
func (st *streamState) deliver(ev Event) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if ev.Finish != FinishNone {
		st.finishes++
	}
	over := st.finishes >= st.samples
	if st.done {
		return over
	}
	// The end-of-generation token comes with its finish event; Generate
	// does not report it, and as it carries no text neither does Next.
	endOnly := ev.Finish == FinishEOS && ev.Text == ""
	if (ev.Token != NoToken || ev.Text != "") && !endOnly {
		st.queue = append(st.queue, ev)
	}
	if ev.Finish != FinishNone {
		st.finish = ev.Finish
		if ev.Err != nil && st.err == nil {
			st.err = ev.Err
		}
	}
	if over {
		st.done = true
		close(st.doneCh)
	}
	return over
}

func (st *streamState) finishesDue() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.samples - st.finishes
}

// end stops the stream with err (nil keeps the error it has) unless it
// already ended; queued tokens are dropped.
func (st *streamState) end(err error) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return false
	}
	st.done = true
	st.queue = nil
	if st.err == nil {
		st.err = err
	}
	if st.finish == FinishNone {
		st.finish = FinishCancelled
	}
	close(st.doneCh)
	return true
}

// abort ends the stream and cancels its request in the library.
func (st *streamState) abort(err error) {
	if st.end(err) {
		st.c.forget(st)
	}
}

// Stream submits a request for prompt and returns a Stream of its tokens.
// opts may be nil (greedy, library defaults).
func (s *Session) Stream(ctx context.Context, prompt []Token, opts *RequestOptions) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, &CancelledError{"stream", err}
	}
	st := &streamState{c: s.c, ctx: ctx, samples: opts.samples(), doneCh: make(chan struct{})}
	if _, err := s.c.submit(prompt, opts, st); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				st.abort(&CancelledError{"stream", ctx.Err()})
			case <-st.doneCh:
			}
		}()
	}
	stream := &Stream{st: st}
	runtime.SetFinalizer(stream, (*Stream).Close)
	return stream, nil
}

// ID is the request's id in its session.
func (s *Stream) ID() RequestID { return s.st.id }

// Next waits for the request's next token and reports whether there is
// one; false means the request finished (FinishReason says why) or failed
// (Err says why).
func (s *Stream) Next() bool {
	st := s.st
	for {
		st.mu.Lock()
		if len(st.queue) > 0 {
			s.current = st.queue[0]
			st.queue[0] = Event{}
			st.queue = st.queue[1:]
			st.mu.Unlock()
			return true
		}
		done := st.done
		st.mu.Unlock()
		if done {
			s.current = Event{}
			return false
		}
		if err := st.ctx.Err(); err != nil {
			st.abort(&CancelledError{"stream", err})
			continue
		}
		select {
		case st.c.stepTurn <- struct{}{}:
		case <-st.ctx.Done():
			continue
		case <-st.doneCh:
			continue
		}
		// Whoever stepped before may have brought this stream's events.
		st.mu.Lock()
		ready := len(st.queue) > 0 || st.done
		st.mu.Unlock()
		if !ready {
			n, err := st.c.stepOnce()
			if err == nil && n == 0 {
				err = st.c.idleError()
			}
			if err != nil {
				st.c.endTurn()
				if st.c.closing.Load() {
					err = ErrClosed
				}
				st.abort(err)
				continue
			}
		}
		st.c.endTurn()
	}
}

// Token is the event Next moved to: its token, text and log-probabilities.
func (s *Stream) Token() Event { return s.current }

// Err is why the stream stopped early: nil after a normal finish.
func (s *Stream) Err() error {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.err
}

// FinishReason is why the request ended, FinishNone while it runs.
func (s *Stream) FinishReason() FinishReason {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if !s.st.done {
		return FinishNone
	}
	return s.st.finish
}

// Close cancels the request if it still runs, freeing its KV blocks; Err
// then gives ErrClosed. It is safe to call more than once and from any
// goroutine.
func (s *Stream) Close() error {
	runtime.SetFinalizer(s, nil)
	s.st.abort(ErrClosed)
	return nil
}

// StreamChannel is Stream as a channel: every token event, then one last
// Event (NoToken, no text) whose Finish says why the request ended and
// whose Err is the Stream's Err; then the channel is closed. Read it to
// the end or cancel ctx, else its goroutine waits forever.
func (s *Session) StreamChannel(ctx context.Context, prompt []Token, opts *RequestOptions) (<-chan Event, error) {
	stream, err := s.Stream(ctx, prompt, opts)
	if err != nil {
		return nil, err
	}
	out := make(chan Event, 16)
	go func() {
		defer close(out)
		defer stream.Close()
		for stream.Next() {
			select {
			case out <- stream.Token():
			case <-ctx.Done():
				stream.st.abort(&CancelledError{"stream", ctx.Err()})
			}
		}
		last := Event{Request: stream.ID(), Token: NoToken, Finish: stream.FinishReason(), Err: stream.Err()}
		select {
		case out <- last:
		case <-ctx.Done():
		}
	}()
	return out, nil
}
