package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Adapter is a LoRA adapter loaded for one model (API 1.4; docs/lora.md):
// a llama.cpp LoRA GGUF file or a Hugging Face PEFT folder. It is
// immutable: any number of requests and sequences of sessions on its
// model may use it at once, from any goroutine.
//
// The library borrows an adapter while a request or sequence uses it, so
// the binding counts those uses. Close marks the adapter closed at once
// (new requests and SetAdapter calls naming it get ErrClosed) and frees
// it when the last request using it has finished and the last sequence
// using it has closed or changed adapter, as Model.Close waits for its
// sessions. An adapter keeps its model loaded until it is freed.
type Adapter struct {
	lendable
	ptr   *C.llm_adapter
	model *Model
}

// AdapterOptions are the options of LoadAdapter; the zero value gives the
// defaults.
type AdapterOptions struct {
	// NoMmap reads a GGUF adapter instead of mapping it while loading.
	NoMmap bool
}

// LoadAdapter loads a LoRA adapter for model from path. A missing file
// gives an *Error with ErrIO, a file that is not an adapter (or one whose
// shapes disagree with the model) ErrBadFormat, an adapter for another
// architecture or beyond a plain LoRA ErrUnsupported; the message names
// the file, tensor or field. A library older than 1.4 gives ErrUnsupported.
// opts may be nil.
func LoadAdapter(model *Model, path string, opts *AdapterOptions) (*Adapter, error) {
	if err := model.acquire(); err != nil {
		return nil, err
	}
	defer model.mu.RUnlock()
	useMmap := C.int(1)
	if opts != nil && opts.NoMmap {
		useMmap = 0
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.llm_adapter
	var msg *C.char
	st := C.shim_adapter_load(model.ptr, cpath, useMmap, &ptr, &msg)
	if err := takeError("load adapter "+path, st, msg); err != nil {
		return nil, err
	}
	// The adapter borrows the model: counted like a session, so that the
	// model's Close waits for it.
	model.sessions.Add(1)
	a := &Adapter{ptr: ptr, model: model}
	a.free = func() {
		C.shim_adapter_free(a.ptr)
		a.ptr = nil
		model.releaseSession()
	}
	runtime.SetFinalizer(a, (*Adapter).Close)
	return a, nil
}

// Close frees the adapter, or marks it closed and frees it once no request
// or sequence uses it any more (see Adapter). Calling it again does nothing.
func (a *Adapter) Close() error {
	runtime.SetFinalizer(a, nil)
	a.close()
	return nil
}

// InUse reports how many requests and sequences the library is lending the
// adapter to now: a closed adapter in use is freed when this reaches 0.
func (a *Adapter) InUse() int { return a.inUse() }

// lend counts one more use of the adapter by the library (a request or a
// sequence) and returns its handle; a closed adapter gives ErrClosed. A nil
// adapter lends nothing.
func (a *Adapter) lend() (*C.llm_adapter, error) {
	if a == nil {
		return nil, nil
	}
	if err := a.lendable.lend(); err != nil {
		return nil, err
	}
	return a.ptr, nil
}

// giveBack ends one use counted by lend; nil is a no-op.
func (a *Adapter) giveBack() {
	if a != nil {
		a.lendable.giveBack()
	}
}

// lendable counts the requests, sequences and samplers the library lends
// a handle to, so that Close can mark it closed at once and free it when
// the last of them ends.
type lendable struct {
	mu     sync.Mutex
	closed bool
	users  int
	free   func() // frees the handle, once, with mu held
}

func (l *lendable) lend() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.users++
	return nil
}

// lendAgain counts a use that an existing one makes (a fork of a
// sequence): allowed after Close, since the handle is still held.
func (l *lendable) lendAgain() {
	l.mu.Lock()
	l.users++
	l.mu.Unlock()
}

func (l *lendable) giveBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.users--
	l.freeIfUnusedLocked()
}

func (l *lendable) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.freeIfUnusedLocked()
}

func (l *lendable) freeIfUnusedLocked() {
	if l.closed && l.users == 0 && l.free != nil {
		l.free()
		l.free = nil
	}
}

func (l *lendable) inUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.users
}

// SeqSetAdapter runs the token-level sequence seq with adapter (one loaded
// for the session's model) at scale, which multiplies the adapter's alpha
// / rank; nil runs it on the base model (llm_seq_set_adapter). Only while
// the sequence holds no tokens, or to give a sequence restored from a
// state saved under an adapter that adapter again (another load of the
// same file) at the same scale; ErrInvalidArgument otherwise. Forks keep
// their source's adapter. The sequence keeps the adapter alive until it
// is closed or given another one.
func (s *Session) SeqSetAdapter(seq SeqID, adapter *Adapter, scale float32) error {
	handle, err := adapter.lend()
	if err != nil {
		return err
	}
	err = s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		st := C.shim_seq_set_adapter(p, C.llm_seq_id(seq), handle, C.float(scale), &msg)
		return takeError("set sequence adapter", st, msg)
	})
	if err != nil {
		adapter.giveBack()
		return err
	}
	s.c.holdSeqAdapter(seq, adapter)
	return nil
}

// holdSeqAdapter records that seq uses adapter (nil: none), giving back the
// adapter it used before.
func (c *session) holdSeqAdapter(seq SeqID, adapter *Adapter) {
	c.adapterMu.Lock()
	old := c.seqAdapters[seq]
	if adapter != nil {
		c.seqAdapters[seq] = adapter
	} else {
		delete(c.seqAdapters, seq)
	}
	c.adapterMu.Unlock()
	old.giveBack()
}

// forkSeqAdapter gives a fork its source's adapter, as the library does.
func (c *session) forkSeqAdapter(src, fork SeqID) {
	c.adapterMu.Lock()
	defer c.adapterMu.Unlock()
	if a := c.seqAdapters[src]; a != nil {
		a.lendAgain()
		c.seqAdapters[fork] = a
	}
}

// holdRequestLoan records what request id borrows until its samples have
// finished; the caller holds routeMu, as route does.
func (c *session) holdRequestLoan(id RequestID, loan *requestLoan) {
	if loan.adapter != nil || loan.grammar != nil {
		c.requestLoans[id] = loan
	}
}

// releaseFinished gives back what a request borrowed at its last finish
// event; the caller holds routeMu.
func (c *session) releaseFinished(ev Event) {
	if ev.Finish == FinishNone {
		return
	}
	held, ok := c.requestLoans[ev.Request]
	if !ok {
		return
	}
	held.finishesDue--
	if held.finishesDue <= 0 {
		delete(c.requestLoans, ev.Request)
		held.giveBack()
	}
}

// releaseAllAdapters gives back every adapter and grammar the session's
// requests and sequences held, once the native session is freed.
func (c *session) releaseAllAdapters() {
	c.routeMu.Lock()
	requests := c.requestLoans
	c.requestLoans = map[RequestID]*requestLoan{}
	c.routeMu.Unlock()
	c.adapterMu.Lock()
	seqs := c.seqAdapters
	c.seqAdapters = map[SeqID]*Adapter{}
	c.adapterMu.Unlock()
	for _, held := range requests {
		held.giveBack()
	}
	for _, a := range seqs {
		a.giveBack()
	}
}

// requestLoan is what the library borrows from one request.
type requestLoan struct {
	adapter     *Adapter
	grammar     *Grammar
	finishesDue int // one finish event per sample
}

func (l *requestLoan) giveBack() {
	l.adapter.giveBack()
	l.grammar.giveBack()
}
